#!/usr/bin/env bash
# doc/architecture.md's layer table is the code's: for every directory of src/ and kernels/,
# the directories its #include lines name are exactly the ones the table lists, the table has
# no cycle, and kernels/ includes nothing of src/ but core/ (no ranks, no configuration).
# usage: layers.sh FRUGAL_BINARY REPO_ROOT (the binary is not used)
set -euo pipefail
root=$2
doc=$root/doc/architecture.md
# The table: the lines between "<!-- layers -->" and "<!-- /layers -->", "dir: dep dep ...".
table=$(sed -n '/<!-- layers -->/,/<!-- \/layers -->/p' "$doc" | grep -E '^[a-z]+: ' || true)
[ -n "$table" ] || { echo "doc/architecture.md has no layer table between <!-- layers --> marks"; exit 1; }
failed=0
actual_deps() {  # the top directories that $1's files include (kernels/ is one directory)
  grep -rhoE '#include "[a-z_]+/' "$1" | sed 's/#include "//; s#/$##' | sort -u | grep -vx "$2" || true
}
documented_deps() {  # the directories the table lists for $1, one a line
  printf '%s\n' "$table" | sed -n "s/^$1: //p" | tr ' ' '\n' | grep -v -e '^-$' -e '^$' || true
}
for dir in "$root"/src/*/ "$root"/kernels/; do
  name=$(basename "$dir")
  actual=$(actual_deps "$dir" "$name" | tr '\n' ' ' | sed 's/ $//')
  documented=$(documented_deps "$name" | sort -u | tr '\n' ' ' | sed 's/ $//')
  # A here-string, not a pipe: grep -q stops at the first match, and under pipefail the
  # writer's SIGPIPE would fail the test now and then.
  if ! grep -q "^$name: " <<<"$table"; then
    echo "doc/architecture.md's layer table has no line for $name/ (it includes: ${actual:-nothing})"
    failed=1
  elif [ "$actual" != "$documented" ]; then
    echo "$name/ includes [${actual}] but doc/architecture.md's layer table says [${documented}]"
    failed=1
  fi
done
# No cycle: repeatedly remove the directories whose dependencies are all removed.
remaining=$(printf '%s\n' "$table" | cut -d: -f1)
while [ -n "$remaining" ]; do
  next=""
  progress=0
  for name in $remaining; do
    deps=$(documented_deps "$name")
    blocked=0
    for d in $deps; do
      if grep -qx "$d" <<<"$(printf '%s\n' $remaining)"; then blocked=1; fi
    done
    if [ "$blocked" -eq 1 ]; then next="$next $name"; else progress=1; fi
  done
  if [ "$progress" -eq 0 ]; then echo "the layer table has a cycle among:$next"; failed=1; break; fi
  remaining=$(echo $next)
done
# Kernels know nothing of ranks or configuration: of src/, only core/.
if [ -n "$(grep -rhoE '#include "[a-z_]+/' "$root/kernels" | grep -vE '"(core|kernels)/' || true)" ]; then
  echo "kernels/ includes more of src/ than core/:"; grep -rnE '#include "[a-z_]+/' "$root/kernels" | grep -vE '"(core|kernels)/'
  failed=1
fi
if grep -rn 'getenv' "$root/kernels" >/dev/null; then
  echo "kernels/ reads the environment:"; grep -rn 'getenv' "$root/kernels"; failed=1
fi
[ "$failed" -eq 0 ] && echo "integration layers: ok"
