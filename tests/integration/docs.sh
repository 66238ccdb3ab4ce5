#!/usr/bin/env bash
# Every key that `frugal train --help` lists is documented in doc/usage.md, and every
# subcommand of `frugal --help` too.
# usage: docs.sh FRUGAL_BINARY REPO_ROOT
set -euo pipefail
frugal=$1
root=$2
missing=0
for key in $("$frugal" train --help | grep -o -- '--[a-z_]*\.[a-z_0-9]*' | grep -v '^--section' | sed 's/^--//' | sort -u); do
  grep -q "\`$key\`" "$root/doc/usage.md" || { echo "doc/usage.md does not document '$key'"; missing=1; }
done
for command in $("$frugal" --help | awk '/^  [a-z]/ { print $1 }'); do
  grep -q "^| \`$command\`" "$root/doc/usage.md" || { echo "doc/usage.md does not list command '$command'"; missing=1; }
done
[ "$missing" -eq 0 ] && echo "integration docs: ok"
