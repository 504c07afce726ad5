#!/usr/bin/env bash
# Mutation testing of one area of the crate (docs/testing.md, "Mutation testing").
#
#   mutants/run.sh AREA [cargo-mutants options...]   mutate AREA's files, run only AREA's tests
#   mutants/run.sh AREA,AREA [options...]            several areas that share their tests
#   mutants/run.sh --areas                           list the areas
#   mutants/run.sh --warm AREA                       build AREA's tests unmutated (a cold cache)
#
# Each area maps the files that hold one idea (fencing, authorization, grants and identity,
# the limiter, helper confinement) to the few test binaries that exercise them: a mutant
# costs a rebuild of the crate plus those binaries, and a pass against the whole suite does
# not fit on two cores. Extra options go to cargo-mutants as given (for example `--list`,
# `--shard 3/40`, `--baseline=skip --timeout 120`, `--shuffle`).
#
# cargo-mutants copies the tree to a temporary directory and builds there (no `--in-place`):
# an interrupted run (the CI budget ends runs that way) can never leave a mutation in the
# checkout. The builds use their own target directory, never the one of the ordinary build,
# so a mutated library can never be taken for a fresh artefact of the real tree.
# Outcomes go to $MUTANTS_OUT/AREA/mutants.out (caught.txt, missed.txt, timeout.txt,
# unviable.txt, outcomes.json).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/execution-provider"
export CARGO_TARGET_DIR="${MUTANTS_TARGET_DIR:-$CACHE/mutants-target}"
MUTANTS_OUT="${MUTANTS_OUT:-$CACHE/mutants-out}"
# Mutation testing is an edit-compile loop over one copy of the tree: each mutant changes one
# function, so incremental compilation pays for its disk here (set MUTANTS_INCREMENTAL=0 to
# turn it off).
export CARGO_INCREMENTAL="${MUTANTS_INCREMENTAL:-1}"

AREAS=(fencing authorization security limiter helper)

# Sets `files` (what is mutated) and `tests` (cargo test target selection) for area $1.
area_definition() {
  case "$1" in
    fencing) # run claims, the operation lease, dispatch admission and completion, revocation
      files=(src/store/predicates.rs src/store/claims.rs src/store/lease.rs
        src/store/dispatch.rs src/store/validate.rs src/store/revoke.rs)
      tests=(--test store_masked_checks --test store_claims --test store_lease
        --test store_dispatch) ;;
    authorization) # every RPC's authority check, and whether a supervised command may run
      files=(src/security/authority.rs src/store/command_authority.rs)
      tests=(--lib --test security_grants --test store_authorization) ;;
    security) # grants, the manifest, keys, the durable ledger, client identity
      files=(src/security/grant.rs src/security/manifest.rs src/security/keys.rs
        src/security/digest.rs src/security/ledger.rs src/security/supervisor_key.rs
        src/security/identity.rs)
      tests=(--lib) ;;
    limiter) # the per-client and global bounds on concurrent calls
      files=(src/server/limiter.rs)
      tests=(--lib) ;;
    helper) # the confined workspace: path resolution, file access, globbing, search
      files=(src/helper/workspace.rs src/helper/files.rs src/helper/glob.rs
        src/helper/search.rs)
      # The conformance cases and the escapes run the (mutated) helper binary itself.
      tests=(--lib --test helper_conformance --test helper_escapes) ;;
    *) echo "unknown area '$1' (areas: ${AREAS[*]})" >&2; return 2 ;;
  esac
}

if [[ "${1:-}" == "--areas" ]]; then
  printf '%s\n' "${AREAS[@]}"
  exit 0
fi
# --warm AREA: build AREA's tests from the unmutated tree once, so that a fresh target
# directory's dependencies are not built inside a mutant's (timed) build.
if [[ "${1:-}" == "--warm" ]]; then
  area_definition "${2:?usage: mutants/run.sh --warm AREA}"
  exec cargo test --package execution-provider --no-run "${tests[@]}"
fi
area="${1:?usage: mutants/run.sh AREA[,AREA...] [cargo-mutants options] | mutants/run.sh --areas}"
shift
# Areas with the same tests can share one run (one build serves them all): AREA,AREA,...
all_files=()
IFS=, read -r -a parts <<<"$area"
for part in "${parts[@]}"; do
  area_definition "$part"
  if [[ -n "${first_tests:-}" && "${tests[*]}" != "$first_tests" ]]; then
    echo "areas '$area' do not share their tests; run them one by one" >&2
    exit 2
  fi
  first_tests="${tests[*]}"
  all_files+=("${files[@]}")
done
files=("${all_files[@]}")

args=(--package execution-provider --output "$MUTANTS_OUT/$area")
for f in "${files[@]}"; do args+=(--file "$f"); done
# `--cargo-arg` reaches the build (`cargo test --no-run`) and the test run alike, so only the
# chosen test binaries are built; arguments after `--` would reach the test run alone.
for t in "${tests[@]}"; do args+=("--cargo-arg=$t"); done
mkdir -p "$MUTANTS_OUT/$area"
exec cargo mutants "${args[@]}" "$@"
