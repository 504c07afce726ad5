#!/usr/bin/env bash
# Judges one cargo-mutants output directory: prints the counts and the kill rate, and fails
# when the tests missed a mutant that mutants/allow-list.txt does not list with a reason.
#
#   mutants/gate.sh PATH/mutants.out
#
# Mutants are compared by their cargo-mutants name without line and column
# ("src/store/claims.rs: replace && with || in claim_matches_parts"), so an entry survives
# edits elsewhere in the file; it covers every mutant of that name in that function.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:?usage: mutants/gate.sh PATH/mutants.out}"
allow=mutants/allow-list.txt

strip_position() { sed -E 's/^([^:]+):[0-9]+:[0-9]+: /\1: /'; }
count() { if [[ -f "$dir/$1" ]]; then grep -c . "$dir/$1" || true; else echo 0; fi; }

# Every entry names a mutant and gives its reason after "  # ".
bad="$(grep -vE '^\s*(#|$)' "$allow" | grep -vE '^[^#]+[^ ]  # .+' || true)"
if [[ -n "$bad" ]]; then
  echo "allow-list entries without a reason (write 'MUTANT  # why'):" >&2
  echo "$bad" >&2
  exit 1
fi

caught=$(count caught.txt)
missed=$(count missed.txt)
timeouts=$(count timeout.txt)
unviable=$(count unviable.txt)
viable=$((caught + missed + timeouts))
rate="n/a"
if ((viable > 0)); then rate="$(((caught + timeouts) * 100 / viable))%"; fi
echo "mutants: caught $caught, missed $missed, timeouts $timeouts, unviable $unviable;" \
  "kill rate (caught + timeouts over viable) $rate"

[[ -f "$dir/missed.txt" ]] || exit 0
listed="$({ grep -vE '^\s*(#|$)' "$allow" || true; } | sed -E 's/  # .*$//' | sort -u)"
unlisted="$(strip_position <"$dir/missed.txt" | sort -u | comm -23 - <(echo "$listed"))"
if [[ -n "$unlisted" ]]; then
  echo "missed mutants that the allow-list does not list (add a test that kills each, or" >&2
  echo "list it in $allow with the reason it is equivalent):" >&2
  echo "$unlisted" >&2
  exit 1
fi
if ((missed > 0)); then
  echo "every missed mutant is on the allow-list:"
  strip_position <"$dir/missed.txt" | sort -u | while read -r m; do
    grep -F -- "$m  # " "$allow" | head -n 1
  done
fi
