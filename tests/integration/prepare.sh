#!/usr/bin/env bash
# `frugal prepare` end to end: a generated fortune corpus -> tokenizer.model, train.tok,
# val.tok, prepare.json; determinism; reuse of a tokenizer; errors exit non-zero with a
# message.   usage: bash prepare.sh <frugal-binary> <repo-root>
set -euo pipefail

FRUGAL=${1:?usage: prepare.sh <frugal-binary> <repo-root>}
FRUGAL=$(realpath "$FRUGAL")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/frugal_prepare.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

die() { echo "prepare.sh: FAILED: $*" >&2; exit 1; }

# expect_error PATTERN CMD...: CMD must exit non-zero and print PATTERN (grep -E).
expect_error() {
  local pattern=$1
  shift
  if "$@" >"$WORK/err.log" 2>&1; then
    die "expected '$*' to fail"
  fi
  grep -qE -- "$pattern" "$WORK/err.log" || { cat "$WORK/err.log" >&2; die "no '$pattern' in the output of '$*'"; }
}

# A few hundred fortune-like entries, separated by lines holding only '%' (awk's seeded
# generator: the same corpus every run).
mkdir -p corpus/sub
awk 'BEGIN {
  srand(42);
  n = split("the a cat dog program computer fortune wise old man said never always " \
            "bug code night day moon sun light dark river mountain friend enemy time " \
            "money love life death truth lie kernel memory cache compiler", w, " ");
  for (e = 0; e < 400; e++) {
    lines = 1 + int(rand() * 4);
    for (l = 0; l < lines; l++) {
      words = 4 + int(rand() * 9);
      s = (e % 11 == 0) ? "    " : "";
      for (k = 0; k < words; k++) s = s w[1 + int(rand() * n)] (k + 1 < words ? " " : "");
      if (rand() < 0.3) s = s ", " int(rand() * 2000);
      print toupper(substr(s, 1, 1)) substr(s, 2) ".";
    }
    if (e % 5 == 0) print "\t\t-- Anonymous";
    print "%";
  }
}' > corpus/fortunes
printf 'binary\0index' > corpus/fortunes.dat       # skipped: a fortune index
ln -s fortunes corpus/fortunes.u8                   # skipped: a second name
printf '{"text": "A JSON document about the moon."}\n{"text": "And one about the sun."}\n' \
  > corpus/sub/extra.jsonl

# --help: exit 0, every option with its default.
"$FRUGAL" prepare --help > help.txt
for opt in --out --vocab-size --val-fraction --seed --tokenizer --format; do
  grep -q -- "$opt" help.txt || die "--help does not list $opt"
done
grep -q -- "--vocab-size N (=2048)" help.txt || die "--help does not show the vocab default"

# The main run.
"$FRUGAL" prepare corpus --out out1 --vocab-size 400 --seed 7 | tee prepare.log
for f in tokenizer.model train.tok val.tok prepare.json; do
  [[ -s out1/$f ]] || die "out1/$f is missing or empty"
done
[[ $(head -c 8 out1/train.tok) == FRUGTOK1 ]] || die "train.tok lacks the FRUGTOK1 magic"
# prepare.json (written with two-space indentation, one key per line).
for stat in '"total": 402,' '"val": 20,' '"vocab_size": 400' '"bos_id": 1' '"eos_id": 2' \
            '"skipped_files": 2'; do
  grep -qF "$stat" out1/prepare.json || die "prepare.json lacks $stat"
done
grep -qE '"train": [1-9][0-9]{3,}' out1/prepare.json || die "prepare.json: no train tokens"
grep -q "documents" prepare.log || die "no progress output"

# Deterministic: the same inputs and seed give byte-identical outputs.
"$FRUGAL" prepare corpus --out out2 --vocab-size 400 --seed 7 > /dev/null
for f in tokenizer.model train.tok val.tok; do
  cmp -s out1/$f out2/$f || die "$f differs between two identical runs"
done

# Reusing the tokenizer gives the same token files.
"$FRUGAL" prepare corpus --out out3 --seed 7 --tokenizer out1/tokenizer.model > /dev/null
cmp -s out1/train.tok out3/train.tok || die "train.tok differs with --tokenizer"
cmp -s out1/tokenizer.model out3/tokenizer.model || die "tokenizer.model was not copied"

# Errors: non-zero exit and a message that says what is wrong.
expect_error "does not exist" "$FRUGAL" prepare --out bad missing_input_dir
expect_error "unrecognised option '--no-such-option'" \
  "$FRUGAL" prepare --out bad --no-such-option corpus
# An option naming one of Boost's placeholders once made its message loop forever.
expect_error "unrecognised option '--.canonical_option" \
  timeout 10 "$FRUGAL" prepare --out bad '--%canonical_option%' corpus
expect_error "--out DIR is required" "$FRUGAL" prepare corpus
expect_error "vocab-size 10 is too small" "$FRUGAL" prepare --out bad --vocab-size 10 corpus
printf '{"text": "fine"}\n{"text": broken\n' > broken.jsonl
expect_error "broken.jsonl:2: invalid JSON" "$FRUGAL" prepare --out bad broken.jsonl
mkdir -p empty && : > empty/nothing
expect_error "corpus is empty" "$FRUGAL" prepare --out bad empty

echo "prepare.sh: OK"
