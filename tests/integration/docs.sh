#!/usr/bin/env bash
# doc/usage.md's table of configuration keys is the one `frugal train --help-keys-markdown`
# prints from the key table, row for row (key, default, allowed values, meaning); every key that
# `frugal train --help` lists is in it; and every subcommand of `frugal --help` is documented.
# usage: docs.sh FRUGAL_BINARY REPO_ROOT
set -euo pipefail
frugal=$1
root=$2
usage="$root/doc/usage.md"
missing=0
expected=$("$frugal" train --help-keys-markdown)
# The table in usage.md: from its header row to the first line that is not a table row.
documented=$(awk '/^\| key \| default \| allowed \| meaning \|$/ { on = 1 } on && !/^\|/ { exit } on' "$usage")
if [ "$documented" != "$expected" ]; then
  echo "doc/usage.md's key table differs from \`frugal train --help-keys-markdown\` (< usage.md, > generated):"
  diff <(echo "$documented") <(echo "$expected") || true
  echo "(paste the output of \`frugal train --help-keys-markdown\` over the table)"
  missing=1
fi
for key in $("$frugal" train --help | grep -o -- '--[a-z_]*\.[a-z_0-9]*' | grep -v '^--section' | sed 's/^--//' | sort -u); do
  grep -q "^| \`$key\` |" <<< "$expected" || { echo "--help lists '$key', the key table does not"; missing=1; }
done
for command in $("$frugal" --help | awk '/^  [a-z]/ { print $1 }'); do
  grep -q "^| \`$command\`" "$usage" || { echo "doc/usage.md does not list command '$command'"; missing=1; }
done
[ "$missing" -eq 0 ] && echo "integration docs: ok"
