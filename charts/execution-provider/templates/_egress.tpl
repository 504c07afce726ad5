{{- /*
  Egress coverage: does a set of NetworkPolicy ipBlocks (each a CIDR minus its exceptions),
  taken together, allow every public address of IPv4 or of IPv6, however it is split
  (0.0.0.0/1 + 128.0.0.0/1 covers as much as 0.0.0.0/0)?

  A prefix is written as its family ("4" or "6") followed by its leading bits ("ep.cidrBits"),
  so "P contains Q" is "Q's string starts with P's". "ep.egressCovers" decides a prefix: covered
  when it is not public at all, or one block contains it and none of that block's exceptions
  touches it; not covered when no CIDR, exception or non-public range starts inside it (then
  every block either contains it or misses it, so the first two answers are exact); otherwise
  both halves decide. Only prefixes on the way to some boundary are visited: at most
  (number of CIDRs) x (address bits) of them.
*/ -}}

{{/* Non-public IPv4 (RFC 6890 special-purpose ranges that are not globally reachable). */}}
{{- define "ep.nonPublicV4" -}}
0.0.0.0/8 10.0.0.0/8 100.64.0.0/10 127.0.0.0/8 169.254.0.0/16 172.16.0.0/12 192.0.0.0/24 192.0.2.0/24 192.168.0.0/16 198.18.0.0/15 198.51.100.0/24 203.0.113.0/24 224.0.0.0/4 240.0.0.0/4
{{- end -}}

{{/* Non-public IPv6: everything outside global unicast 2000::/3, and the documentation ranges. */}}
{{- define "ep.nonPublicV6" -}}
::/3 4000::/2 8000::/1 2001:db8::/32 3fff::/20
{{- end -}}

{{/* A CIDR as its family and leading bits ("4" + prefix-length bits); fails on a malformed one. */}}
{{- define "ep.cidrBits" -}}
{{- $cidr := . -}}
{{- $parts := splitList "/" $cidr -}}
{{- if or (ne (len $parts) 2) (not (regexMatch "^[0-9]{1,3}$" (index $parts 1))) -}}
{{- fail (printf "%s is not a CIDR" $cidr) -}}
{{- end -}}
{{- $address := index $parts 0 -}}
{{- $length := atoi (index $parts 1) -}}
{{- $family := "4" -}}
{{- $bits := "" -}}
{{- if contains ":" $address -}}
  {{- $family = "6" -}}
  {{- $halves := splitList "::" $address -}}
  {{- if gt (len $halves) 2 -}}{{- fail (printf "%s is not a CIDR" $cidr) -}}{{- end -}}
  {{- $head := list -}}
  {{- if index $halves 0 -}}{{- $head = splitList ":" (index $halves 0) -}}{{- end -}}
  {{- $tail := list -}}
  {{- if and (eq (len $halves) 2) (index $halves 1) -}}{{- $tail = splitList ":" (index $halves 1) -}}{{- end -}}
  {{- $groups := $head -}}
  {{- if eq (len $halves) 2 -}}
    {{- $missing := sub 8 (add (len $head) (len $tail)) -}}
    {{- if lt (int $missing) 1 -}}{{- fail (printf "%s is not a CIDR" $cidr) -}}{{- end -}}
    {{- range until (int $missing) -}}{{- $groups = append $groups "0" -}}{{- end -}}
    {{- $groups = concat $groups $tail -}}
  {{- end -}}
  {{- if ne (len $groups) 8 -}}{{- fail (printf "%s is not a CIDR" $cidr) -}}{{- end -}}
  {{- $nibbles := dict "0" "0000" "1" "0001" "2" "0010" "3" "0011" "4" "0100" "5" "0101" "6" "0110" "7" "0111" "8" "1000" "9" "1001" "a" "1010" "b" "1011" "c" "1100" "d" "1101" "e" "1110" "f" "1111" -}}
  {{- range $groups -}}
    {{- if not (regexMatch "^[0-9a-fA-F]{1,4}$" .) -}}{{- fail (printf "%s is not a CIDR" $cidr) -}}{{- end -}}
    {{- range splitList "" (printf "%s%s" (repeat (sub 4 (len .) | int) "0") (lower .)) -}}
      {{- $bits = printf "%s%s" $bits (index $nibbles .) -}}
    {{- end -}}
  {{- end -}}
{{- else -}}
  {{- $octets := splitList "." $address -}}
  {{- if ne (len $octets) 4 -}}{{- fail (printf "%s is not a CIDR" $cidr) -}}{{- end -}}
  {{- range $octets -}}
    {{- if or (not (regexMatch "^[0-9]{1,3}$" .)) (gt (atoi .) 255) -}}{{- fail (printf "%s is not a CIDR" $cidr) -}}{{- end -}}
    {{- $bits = printf "%s%08b" $bits (atoi .) -}}
  {{- end -}}
{{- end -}}
{{- if gt $length (len $bits) -}}{{- fail (printf "%s is not a CIDR" $cidr) -}}{{- end -}}
{{- printf "%s%s" $family (trunc $length $bits) -}}
{{- end -}}

{{/* Whether prefix .p is covered: "true" or "false". .blocks: [{cidr: bits, except: [bits]}];
     .nonPublic: [bits]. */}}
{{- define "ep.egressCovers" -}}
{{- $p := .p -}}
{{- $covered := false -}}
{{- $split := false -}}
{{- range .nonPublic -}}
  {{- if hasPrefix . $p -}}{{- $covered = true -}}{{- end -}}
  {{- if and (hasPrefix $p .) (gt (len .) (len $p)) -}}{{- $split = true -}}{{- end -}}
{{- end -}}
{{- range .blocks -}}
  {{- $touched := false -}}
  {{- range .except -}}
    {{- if or (hasPrefix . $p) (hasPrefix $p .) -}}{{- $touched = true -}}{{- end -}}
    {{- if and (hasPrefix $p .) (gt (len .) (len $p)) -}}{{- $split = true -}}{{- end -}}
  {{- end -}}
  {{- if and (hasPrefix .cidr $p) (not $touched) -}}{{- $covered = true -}}{{- end -}}
  {{- if and (hasPrefix $p .cidr) (gt (len .cidr) (len $p)) -}}{{- $split = true -}}{{- end -}}
{{- end -}}
{{- if $covered -}}
true
{{- else if not $split -}}
false
{{- else if eq (include "ep.egressCovers" (dict "p" (printf "%s0" $p) "blocks" .blocks "nonPublic" .nonPublic)) "true" -}}
{{- include "ep.egressCovers" (dict "p" (printf "%s1" $p) "blocks" .blocks "nonPublic" .nonPublic) -}}
{{- else -}}
false
{{- end -}}
{{- end -}}

{{/* Fails the render when the ipBlocks .blocks ([{cidr, except}]) together allow every public
     IPv4 or every public IPv6 address; .what names them in the message. Every exception must lie
     inside its CIDR (as the API server requires). */}}
{{- define "ep.refuseOpenEgress" -}}
{{- $blocks := list -}}
{{- range .blocks -}}
  {{- $raw := .cidr -}}
  {{- $cidr := include "ep.cidrBits" $raw -}}
  {{- $except := list -}}
  {{- range (.except | default list) -}}
    {{- $bits := include "ep.cidrBits" . -}}
    {{- if not (and (hasPrefix $cidr $bits) (gt (len $bits) (len $cidr))) -}}
      {{- fail (printf "%s: except %s is not inside %s" $.what . $raw) -}}
    {{- end -}}
    {{- $except = append $except $bits -}}
  {{- end -}}
  {{- $blocks = append $blocks (dict "cidr" $cidr "except" $except) -}}
{{- end -}}
{{- $nonPublic := list -}}
{{- range splitList " " (printf "%s %s" (include "ep.nonPublicV4" .) (include "ep.nonPublicV6" .)) -}}
  {{- $nonPublic = append $nonPublic (include "ep.cidrBits" .) -}}
{{- end -}}
{{- range list "4" "6" -}}
  {{- if eq (include "ep.egressCovers" (dict "p" . "blocks" $blocks "nonPublic" $nonPublic)) "true" -}}
    {{- fail (printf "%s: together these ranges allow every public IPv%s address, which would open %s to the internet" $.what . $.who) -}}
  {{- end -}}
{{- end -}}
{{- end -}}
