// The data layer: corpus readers, JSONL errors, token files, the sampler (determinism,
// resume, rank split) and tokenizer training (round trip, determinism).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/error.h"
#include "data/corpus.h"
#include "data/sampler.h"
#include "data/shuffle.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "data/train_on.h"

namespace fs = std::filesystem;
using namespace frugal;

namespace {

// A fresh directory under /tmp, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("frugal_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The message of the Error that `fn` throws (fails the test if none is thrown).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("no frugal::Error was thrown");
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<int32_t> as_vector(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

// The texts of text documents.
std::vector<std::string> texts(const std::vector<CorpusDocument>& docs) {
  std::vector<std::string> out;
  for (const CorpusDocument& d : docs) out.push_back(d.text);
  return out;
}

std::vector<int32_t> ramp_tokens(int32_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;  // token value = position
  return ids;
}

}  // namespace

TEST_CASE("fortune files split on lines holding only %", "[data][corpus]") {
  const std::string text =
      "\n  indented first line\nsecond line  \n%\nTwo\r\n%\r\n%\n\n\n%\nlast one\n  \n%";
  REQUIRE(has_fortune_separator(text));
  REQUIRE_FALSE(has_fortune_separator("100% sure\n %\n%%\n"));
  const auto docs = split_fortunes(text);
  REQUIRE(docs.size() == 3);
  CHECK(docs[0] == "  indented first line\nsecond line");  // indentation kept, tail trimmed
  CHECK(docs[1] == "Two");
  CHECK(docs[2] == "last one");
  CHECK(split_fortunes("no separator at all\n") == std::vector<std::string>{"no separator at all"});
}

TEST_CASE("directories are walked in order, skipping .dat, binaries, links and dot files",
          "[data][corpus]") {
  TempDir dir;
  fs::create_directories(dir.path / "sub");
  fs::create_directories(dir.path / ".hidden");
  write_text(dir.file("b_fortunes"), "one\n%\ntwo\n%\nthree\n");
  write_text(dir.file("b_fortunes.dat"), std::string("\0\0\0\2index", 9));
  fs::create_symlink("b_fortunes", dir.path / "b_fortunes.u8");
  write_text(dir.file("a_text"), "a whole file\n%s is not a separator\n");
  write_text(dir.file("sub/c.jsonl"), "{\"text\": \"from json\"}\n\n{\"text\": \"again\"}\n");
  write_text(dir.file("sub/image.bin"), std::string("PNG\0\0data", 9));
  write_text(dir.file(".hidden/secret"), "never read");
  write_text(dir.file("sub/latin1"), "caf\xe9\n");  // invalid UTF-8: skipped, counted
  write_text(dir.file("sub/blank"), "  \n\n");      // empty: skipped, counted

  Corpus corpus = read_corpus({dir.path.string()});
  const std::vector<std::string> expected = {
      "a whole file\n%s is not a separator\n", "one", "two", "three", "from json", "again"};
  CHECK(texts(corpus.documents) == expected);
  CHECK(corpus.stats.documents == 6);
  CHECK(corpus.stats.files == 5);          // a_text, b_fortunes, blank, c.jsonl, latin1
  CHECK(corpus.stats.skipped_files == 3);  // .dat, the .u8 link, image.bin
  CHECK(corpus.stats.skipped_invalid_utf8 == 1);
  CHECK(corpus.stats.skipped_empty == 1);

  // Forcing a format overrides detection.
  Corpus forced = read_corpus({dir.file("b_fortunes")}, {.format = CorpusFormat::text});
  CHECK(texts(forced.documents) == std::vector<std::string>{"one\n%\ntwo\n%\nthree\n"});

  // Explicit paths: a missing one, or a binary one, is an error naming it.
  CHECK(contains(error_of([&] { read_corpus({dir.file("nope")}); }), "nope' does not exist"));
  CHECK(contains(error_of([&] { read_corpus({dir.file("sub/image.bin")}); }), "looks binary"));
  CHECK(enum_from_name<CorpusFormat>("jsonl") == CorpusFormat::jsonl);
  CHECK_FALSE(enum_from_name<CorpusFormat>("xml").has_value());
}

TEST_CASE("JSONL: text and alpaca records, errors name the line", "[data][corpus]") {
  const std::string good =
      "{\"text\": \"plain\"}\n"
      "{\"instruction\": \"Add.\", \"input\": \"1 2\", \"output\": \"3\"}\n"
      "\n"
      "{\"instruction\": \"Greet.\", \"output\": \"Hi\"}\n";
  // Every record of a file has the format of its first: text, then alpaca, is refused.
  CHECK(contains(error_of([&] { parse_jsonl(good, "g.jsonl"); }),
                 "g.jsonl:2: a alpaca record in a file of text records (told by g.jsonl:1)"));
  const auto docs = parse_jsonl(good.substr(good.find('\n') + 1), "g.jsonl");
  REQUIRE(docs.size() == 2);
  CHECK(docs[0].content == DocumentContent::instruction);
  CHECK(docs[0].text == alpaca_prompt("Add.", "1 2"));
  CHECK(docs[0].completion == "3");
  CHECK(contains(docs[0].text + docs[0].completion, "### Input:\n1 2\n\n### Response:\n3"));
  CHECK(docs[1].text + docs[1].completion == alpaca_prompt("Greet.", "") + "Hi");
  CHECK_FALSE(contains(docs[1].text, "### Input"));
  CHECK(docs[1].where == "g.jsonl:3");

  const std::string bad = "{\"text\": \"ok\"}\n{\"text\": \"fine\"}\n{\"text\": oops}\n";
  const std::string msg = error_of([&] { parse_jsonl(bad, "data/bad.jsonl"); });
  CHECK(contains(msg, "data/bad.jsonl:3: invalid JSON"));
  CHECK(contains(error_of([] { parse_jsonl("{\"title\": \"x\"}\n", "f.jsonl"); }),
                 "f.jsonl:1: the record has none of the fields that tell its format"));
  CHECK(contains(error_of([] { parse_jsonl("[1, 2]\n", "f.jsonl"); }),
                 "f.jsonl:1: expected a JSON object"));
  CHECK(contains(error_of([] { parse_jsonl("{\"text\": 5}\n", "f.jsonl"); }),
                 "field 'text' is not a string"));

  // Through the file reader: the message names the file and the line.
  TempDir dir;
  write_text(dir.file("x.jsonl"), bad);
  CHECK(
      contains(error_of([&] { read_corpus({dir.file("x.jsonl")}); }), dir.file("x.jsonl") + ":3:"));
  // A .json file holding an array (Stanford Alpaca's alpaca_data.json).
  write_text(dir.file("a.json"), "[{\"instruction\": \"I\", \"input\": \"\", \"output\": \"O\"}]");
  const Corpus array = read_corpus({dir.file("a.json")});
  REQUIRE(array.documents.size() == 1);
  CHECK(array.documents[0].text + array.documents[0].completion == alpaca_prompt("I", "") + "O");
  CHECK(array.documents[0].where == dir.file("a.json") + ": record 0");
}

TEST_CASE("JSONL: a line that is not UTF-8 is skipped and counted, the rest read", "[data][corpus]") {
  // Issue 51: nlohmann refuses invalid UTF-8 in a string, and the whole file was refused.
  TempDir dir;
  write_text(dir.file("mixed.jsonl"),
             "{\"text\": \"first\"}\n{\"text\": \"caf\xe9\"}\n{\"text\": \"third\"}\n");
  const Corpus corpus = read_corpus({dir.file("mixed.jsonl")});
  CHECK(texts(corpus.documents) == std::vector<std::string>{"first", "third"});
  CHECK(corpus.stats.skipped_invalid_utf8 == 1);
}

TEST_CASE("UTF-8 validation", "[data][corpus]") {
  CHECK(is_valid_utf8("plain ascii\n"));
  CHECK(is_valid_utf8("\xc3\xa9t\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80"));
  CHECK_FALSE(is_valid_utf8("caf\xe9"));           // Latin-1
  CHECK_FALSE(is_valid_utf8("\xc0\xaf"));          // overlong '/'
  CHECK_FALSE(is_valid_utf8("\xed\xa0\x80"));      // surrogate
  CHECK_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  CHECK_FALSE(is_valid_utf8("\xe4\xb8"));          // cut short
}

TEST_CASE("token files round-trip and reject damage", "[data][token_file]") {
  TempDir dir;
  const std::vector<std::vector<int32_t>> docs = {{5, 6, 7}, {}, {300, 4}};
  const std::string path = dir.file("small.tok");
  TokenFileHeader written = write_token_file(path, docs, 512, 1, 2);
  CHECK(written.token_bytes == 2);
  CHECK(written.num_documents == 3);
  CHECK(written.num_tokens == 3 + 2 + 0 + 2 + 2 + 2);
  // Ids (22 bytes, padded to 24), then the 4 document starts.
  CHECK(fs::file_size(path) == kTokenFileHeaderBytes + 24 + 8 * 4);
  CHECK_FALSE(written.has_roles);
  CHECK(written.content == content_bit(DocumentContent::text));
  CHECK_FALSE(fs::exists(path + ".tmp"));

  TokenFile file(path);
  CHECK(file.header().vocab_size == 512);
  CHECK(file.header().bos_id == 1);
  CHECK(file.header().eos_id == 2);
  CHECK(file.read_all() == std::vector<int32_t>{1, 5, 6, 7, 2, 1, 2, 1, 300, 4, 2});
  CHECK(file[8] == 300);
  CHECK(read_token_file_header(path).num_tokens == 11);
  CHECK(file.roles() == nullptr);
  CHECK(std::vector<uint64_t>(file.document_starts().begin(), file.document_starts().end()) ==
        std::vector<uint64_t>{0, 5, 7, 11});

  // Without bos (a Qwen2-style tokenizer): every document is ids..., eos.
  const std::string no_bos = dir.file("no_bos.tok");
  CHECK(write_token_file(no_bos, docs, 512, -1, 2).num_tokens == 3 + 1 + 0 + 1 + 2 + 1);
  CHECK(TokenFile(no_bos).header().bos_id == -1);
  CHECK(TokenFile(no_bos).read_all() == std::vector<int32_t>{5, 6, 7, 2, 2, 300, 4, 2});
  CHECK(contains(error_of([&] { write_token_file(dir.file("bad.tok"), docs, 512, -2, 2); }),
                 "bos id -2 and eos id 2 must lie in the vocabulary [0, 512)"));

  // Large vocabularies use 4-byte ids.
  const std::string wide = dir.file("wide.tok");
  write_token_file(wide, {{70000, 3}}, 70001, 1, 2);
  TokenFile wide_file(wide);
  CHECK(wide_file.header().token_bytes == 4);
  CHECK(wide_file.read_all() == std::vector<int32_t>{1, 70000, 3, 2});

  // Truncated: the message names the file, the expected and the actual size.
  const std::string bytes = read_bytes(path);
  const std::string cut = dir.file("cut.tok");
  write_text(cut, bytes.substr(0, bytes.size() - 3));
  const std::string msg = error_of([&] { TokenFile t(cut); });
  CHECK(contains(msg, cut));
  CHECK(contains(msg, "truncated"));
  CHECK(contains(msg, std::to_string(bytes.size()) + " bytes"));
  CHECK(contains(msg, std::to_string(bytes.size() - 3) + " bytes"));
  write_text(cut, bytes.substr(0, 10));
  CHECK(contains(error_of([&] { TokenFile t(cut); }), "truncated"));

  // Not a token file; an id past the vocabulary; a missing file.
  write_text(cut, "hello, this is not a token file at all, just some text here....");
  CHECK(contains(error_of([&] { TokenFile t(cut); }), "not a frugal token file"));
  std::string corrupt = bytes;
  corrupt[kTokenFileHeaderBytes + 2 * 3] = '\xff';  // id 7 -> 0x7fff >= 512
  corrupt[kTokenFileHeaderBytes + 2 * 3 + 1] = '\x7f';
  write_text(cut, corrupt);
  CHECK(contains(error_of([&] { TokenFile t(cut); }), "at position 3 is outside the vocabulary"));
  CHECK(contains(error_of([&] { TokenFile t(dir.file("missing.tok")); }), "missing.tok"));
  CHECK(contains(error_of([&] { write_token_file(cut, {{512}}, 512, 1, 2); }),
                 "outside the vocabulary"));
}

TEST_CASE("token files: a header whose byte count overflows is refused, not read",
          "[data][token_file]") {
  // 2^63 + 4 two-byte tokens is 2^64 + 8 bytes: wrapped around 64 bits, the header's size
  // would match a file of 4 tokens, and reading its ids would run past the mapping.
  TempDir dir;
  const std::string path = dir.file("huge.tok");
  write_token_file(path, {{5, 6}}, 512, 1, 2);  // 4 tokens: bos 5 6 eos
  std::string bytes = read_bytes(path);
  const uint64_t promised = (uint64_t(1) << 63) + 4;
  std::memcpy(bytes.data() + 16, &promised, sizeof promised);
  write_text(path, bytes);
  for (const std::string& msg :
       {error_of([&] { TokenFile t(path); }), error_of([&] { read_token_file_header(path); })}) {
    CHECK(contains(msg, path));
    CHECK(contains(msg, "num_tokens"));
    CHECK(contains(msg, "9223372036854775812 x 2 does not fit in uint64"));
  }
}

TEST_CASE("sampler and eval iterator: batch sizes that overflow are refused by name",
          "[data][sampler]") {
  const auto tokens = ramp_tokens(1000);
  // 2^62 rows of 16 tokens: the [rows, seq_len] batch has 2^66 elements.
  const int64_t rows = int64_t(1) << 62;
  const std::string msg = error_of([&] {
    BatchSampler s(view_of(tokens), {.seq_len = 16, .micro_batch_size = rows, .seed = 1});
  });
  CHECK(contains(msg, "micro_batch_size"));
  CHECK(contains(msg, "4611686018427387904 x 16 does not fit in int64"));
  // The global batch (world x micro_batch_size rows) overflows, the rows of one rank do not
  // (2^61 + 1 rows of one id are 2^63 + 4 bytes).
  const int64_t quarter = (int64_t(1) << 61) + 1;
  CHECK(
      contains(error_of([&] {
                 BatchSampler s(
                     view_of(tokens),
                     {.seq_len = 1, .micro_batch_size = quarter, .seed = 1, .rank = 0, .world = 4});
               }),
               "4 x 2305843009213693953 does not fit in int64"));
  const int64_t most = std::numeric_limits<int64_t>::max();
  CHECK(contains(error_of([&] { EvalIterator it(view_of(tokens), 8, most, 0, 2); }),
                 "micro_batch_size"));
  CHECK(contains(error_of([&] { EvalIterator it(view_of(tokens), 8, int64_t(1) << 61); }),
                 "2305843009213693952 x 8 does not fit in int64"));
}

TEST_CASE("seeded permutations are portable and unbiased in shape", "[data][sampler]") {
  // Fixed values: a change here changes every data order (and breaks resumed runs).
  const auto p = seeded_permutation(10, 42);
  std::set<int64_t> seen(p.begin(), p.end());
  CHECK(seen.size() == 10);
  CHECK(*seen.begin() == 0);
  CHECK(*seen.rbegin() == 9);
  CHECK(seeded_permutation(10, 42) == p);
  CHECK(seeded_permutation(10, 43) != p);
  CHECK(seeded_permutation(10, 42, 1) != p);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) CHECK(bounded_random(rng, 3) < 3);
}

TEST_CASE("sampler: targets are the inputs shifted by one", "[data][sampler]") {
  const auto tokens = ramp_tokens(1000);
  BatchSampler sampler(view_of(tokens), {.seq_len = 16, .micro_batch_size = 4, .seed = 1});
  CHECK(sampler.windows_per_epoch() == 999 / 16);
  for (int b = 0; b < 5; ++b) {
    TokenBatch batch = sampler.next();
    REQUIRE(batch.inputs.shape() == Shape{4, 16});
    REQUIRE(batch.targets.shape() == Shape{4, 16});
    CHECK(batch.target_tokens == 64);
    const auto in = as_vector(batch.inputs);
    const auto tg = as_vector(batch.targets);
    for (int r = 0; r < 4; ++r) {
      CHECK(in[r * 16] % 16 == 0);  // windows start at multiples of seq_len
      for (int j = 0; j < 16; ++j) CHECK(tg[r * 16 + j] == in[r * 16 + j] + 1);
    }
  }
}

TEST_CASE("sampler: every window once per epoch, epochs differ", "[data][sampler]") {
  const auto tokens = ramp_tokens(10 * 7 + 1);  // exactly 10 windows of 7
  BatchSampler sampler(view_of(tokens), {.seq_len = 7, .micro_batch_size = 3, .seed = 9});
  REQUIRE(sampler.windows_per_epoch() == 10);
  std::vector<int32_t> starts;
  for (int b = 0; b < 10; ++b) {  // 30 rows = 3 epochs, batches spanning epochs
    const auto in = as_vector(sampler.next().inputs);
    for (int r = 0; r < 3; ++r) starts.push_back(in[r * 7]);
  }
  CHECK(sampler.state() == SamplerState{3, 0});
  for (int e = 0; e < 3; ++e) {
    std::set<int32_t> epoch(starts.begin() + e * 10, starts.begin() + (e + 1) * 10);
    CHECK(epoch.size() == 10);
    CHECK(*epoch.rbegin() == 63);
  }
  CHECK(!std::equal(starts.begin(), starts.begin() + 10, starts.begin() + 10));
}

TEST_CASE("sampler: deterministic, and resume is bit-identical", "[data][sampler]") {
  const auto tokens = ramp_tokens(5000);
  const SamplerConfig config{.seq_len = 32, .micro_batch_size = 5, .seed = 77};
  BatchSampler a(view_of(tokens), config);
  BatchSampler b(view_of(tokens), config);
  for (int i = 0; i < 7; ++i) {
    TokenBatch x = a.next(), y = b.next();
    CHECK(as_vector(x.inputs) == as_vector(y.inputs));
    CHECK(as_vector(x.targets) == as_vector(y.targets));
  }
  SamplerConfig other = config;
  other.seed = 78;
  BatchSampler c(view_of(tokens), other);
  CHECK(as_vector(c.next().inputs) !=
        as_vector(BatchSampler(view_of(tokens), config).next().inputs));

  // Run k batches, save the state, continue; a fresh sampler restored from the state must
  // hand out the same batches, across an epoch boundary too (156 windows, 5 per batch).
  const SamplerState saved = a.state();
  CHECK(saved.position == 35);
  std::vector<std::vector<int32_t>> continued;
  for (int i = 0; i < 40; ++i) continued.push_back(as_vector(a.next().inputs));
  CHECK(a.state().epoch == 1);
  BatchSampler fresh(view_of(tokens), config);
  fresh.restore(saved);
  CHECK(fresh.state() == saved);
  for (int i = 0; i < 40; ++i) CHECK(as_vector(fresh.next().inputs) == continued[size_t(i)]);
  CHECK(fresh.state() == a.state());
  CHECK(contains(error_of([&] { fresh.restore({0, 100000}); }), "position 100000"));
  CHECK(contains(error_of([&] { BatchSampler s(view_of(ramp_tokens(10)), config); }),
                 "holds 10 tokens"));
}

TEST_CASE("sampler: ranks take disjoint slices whose union is the global batch",
          "[data][sampler]") {
  const auto tokens = ramp_tokens(3001);
  const int world = 3;
  const int64_t rows = 4;
  BatchSampler global(view_of(tokens),
                      {.seq_len = 10, .micro_batch_size = world * rows, .seed = 5});
  std::vector<BatchSampler> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back(
        view_of(tokens),
        SamplerConfig{
            .seq_len = 10, .micro_batch_size = rows, .seed = 5, .rank = r, .world = world});
  for (int step = 0; step < 30; ++step) {  // 300 windows / 12 rows: crosses an epoch
    const auto whole = as_vector(global.next().inputs);
    std::set<int32_t> starts;
    for (int r = 0; r < world; ++r) {
      const auto part = as_vector(ranks[size_t(r)].next().inputs);
      REQUIRE(part.size() == size_t(rows * 10));
      CHECK(std::equal(part.begin(), part.end(), whole.begin() + r * rows * 10));
      for (int64_t i = 0; i < rows; ++i) starts.insert(part[size_t(i * 10)]);
      CHECK(ranks[size_t(r)].state() == global.state());
    }
    CHECK(starts.size() == size_t(world * rows));  // disjoint within an epoch's batch
  }
}

TEST_CASE("eval iterator: every window in order, padded at the end", "[data][sampler]") {
  const auto tokens = ramp_tokens(50);  // 49 targets: windows of 8 -> 7 windows, last has 1
  EvalIterator it(view_of(tokens), 8, 2);
  CHECK(it.num_windows() == 7);
  CHECK(it.num_batches() == 4);
  TokenBatch batch;
  int64_t targets = 0;
  std::vector<int32_t> all_targets;
  while (it.next(batch)) {
    targets += batch.target_tokens;
    const auto in = as_vector(batch.inputs);
    const auto tg = as_vector(batch.targets);
    for (size_t i = 0; i < tg.size(); ++i) {
      if (tg[i] != kIgnoreTarget) {
        CHECK(tg[i] == in[i] + 1);
        all_targets.push_back(tg[i]);
      }
    }
  }
  CHECK(targets == 49);
  std::vector<int32_t> expected(49);
  for (int i = 0; i < 49; ++i) expected[size_t(i)] = i + 1;
  CHECK(all_targets == expected);  // each target exactly once, in order

  // Two ranks: the same number of batches each, the windows split between them.
  EvalIterator r0(view_of(tokens), 8, 2, 0, 2), r1(view_of(tokens), 8, 2, 1, 2);
  CHECK(r0.num_batches() == 2);
  CHECK(r1.num_batches() == 2);
  int64_t both = 0;
  TokenBatch b0, b1;
  while (r0.next(b0) && r1.next(b1)) both += b0.target_tokens + b1.target_tokens;
  CHECK(both == 49);
  // Capped.
  EvalIterator capped(view_of(tokens), 8, 2, 0, 1, 1);
  CHECK(capped.num_batches() == 1);
  CHECK(EvalIterator(view_of(std::vector<int32_t>{}), 8, 2).num_batches() == 0);
}

namespace {
// A reproducible corpus of made-up words with punctuation, digits, indentation and UTF-8.
std::vector<std::string> generated_corpus(int documents) {
  std::mt19937_64 rng(123);
  const std::vector<std::string> syllables = {"ka", "lo",  "mi",  "ne",  "ru", "sa", "to", "vi",
                                              "ze", "qua", "str", "ing", "th", "er", "é",  "ü"};
  std::vector<std::string> words;
  for (int w = 0; w < 300; ++w) {
    std::string word;
    const int n = 1 + int(rng() % 3);
    for (int s = 0; s < n; ++s) word += syllables[rng() % syllables.size()];
    words.push_back(word);
  }
  std::vector<std::string> docs;
  for (int d = 0; d < documents; ++d) {
    std::string doc = (d % 7 == 0) ? "    " : "";
    const int n = 10 + int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      doc += words[rng() % words.size()];
      doc +=
          (i % 9 == 8) ? ".\n" : (i % 13 == 12 ? ", " + std::to_string(rng() % 1000) + " " : " ");
    }
    doc += "中文 -- end";
    docs.push_back(doc);
  }
  return docs;
}
}  // namespace

TEST_CASE("tokenizer: train, encode, decode, deterministic", "[data][tokenizer]") {
  TempDir dir;
  const auto docs = generated_corpus(1500);
  TokenizerTrainOptions options;
  options.vocab_size = 400;
  const std::string first = dir.file("first.model");
  const std::string second = dir.file("second.model");
  train_tokenizer(docs, first, options);
  train_tokenizer(docs, second, options);
  CHECK(read_bytes(first) == read_bytes(second));  // same input, same model, byte for byte

  Tokenizer tok(first);
  CHECK(tok.vocab_size() == 400);
  CHECK(tok.unk_id() == 0);
  CHECK(tok.bos_id() == 1);
  CHECK(tok.eos_id() == 2);
  CHECK(tok.pad_id() == -1);
  for (int i = 0; i < 50; ++i) {
    const auto ids = tok.encode(docs[size_t(i)]);
    CHECK(ids.size() < docs[size_t(i)].size());  // merges happened
    CHECK(tok.decode(ids) == docs[size_t(i)]);
  }
  // Unseen characters go through byte fallback and still round-trip.
  const std::string unseen = "Ωmega\ttab\x01 ~{}|\n\n  spaces  ";
  CHECK(tok.decode(tok.encode(unseen)) == unseen);
  CHECK(tok.piece(tok.encode("\t")[1]) == "<0x09>");
  CHECK(contains(error_of([&] { tok.decode({5, 400}); }), "id 400"));

  // From a text file (one document).
  std::string joined;
  for (const auto& d : docs) joined += d + "\n";
  write_text(dir.file("corpus.txt"), joined);
  train_tokenizer_from_file(dir.file("corpus.txt"), dir.file("file.model"), options);
  Tokenizer from_file(dir.file("file.model"));
  CHECK(from_file.vocab_size() == 400);
  CHECK(from_file.decode(from_file.encode(docs[0])) == docs[0]);
  // A long text encoded piece by piece gives the ids of the whole, and tells each piece's bytes.
  int64_t told = 0, pieces = 0;
  const auto long_ids = from_file.encode_long(
      joined, [&](int64_t bytes) { told += bytes, ++pieces; }, 1000);
  CHECK(long_ids == from_file.encode(joined));
  CHECK(told == int64_t(joined.size()));
  CHECK(pieces > 20);
  // One line: the pieces are cut before spaces.
  std::string one_line = joined;
  std::replace(one_line.begin(), one_line.end(), '\n', ' ');
  pieces = 0;
  CHECK(from_file.encode_long(
            one_line, [&](int64_t) { ++pieces; }, 1000) == from_file.encode(one_line));
  CHECK(pieces > 20);

  // Errors: missing or invalid model, too small a vocab.
  CHECK(contains(error_of([&] { Tokenizer t(dir.file("nope.model")); }), "nope.model"));
  write_text(dir.file("junk.model"), "not a model");
  CHECK(contains(error_of([&] { Tokenizer t(dir.file("junk.model")); }),
                 "not a valid SentencePiece model"));
  options.vocab_size = 100;
  CHECK(contains(error_of([&] { train_tokenizer(docs, dir.file("x.model"), options); }),
                 "too small"));
  options.vocab_size = 400;
  CHECK(contains(error_of([&] {
                   train_tokenizer({"", ""}, dir.file("x.model"), options);
                 }),
                 "no text"));
}

namespace {

// A version 1 token file (before roles and document starts), byte for byte as frugal wrote it.
std::string version1_file(const std::vector<uint16_t>& ids, uint32_t vocab, int32_t bos,
                          int32_t eos, uint64_t documents) {
  std::string bytes(kTokenFileHeaderBytes, '\0');
  auto put = [&](size_t at, auto value) { std::memcpy(bytes.data() + at, &value, sizeof value); };
  std::memcpy(bytes.data(), kTokenFileMagic, sizeof kTokenFileMagic);
  put(8, uint32_t{1});
  put(12, uint32_t{2});
  put(16, uint64_t{ids.size()});
  put(24, documents);
  put(32, vocab);
  put(36, bos);
  put(40, eos);
  put(44, kTokenFileHeaderBytes);
  bytes.append(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);
  return bytes;
}

TokenizedDocument chat_document(std::vector<int32_t> ids, std::vector<TokenRole> roles) {
  return {std::move(ids), std::move(roles), DocumentContent::chat};
}

}  // namespace

TEST_CASE("token files: roles and document starts round-trip, damage is named",
          "[data][token_file]") {
  TempDir dir;
  const std::string path = dir.file("chat.tok");
  using R = TokenRole;
  {
    TokenFileWriter writer(path, 70000, -1, 9);  // 4-byte ids, no bos
    writer.add_document(
        chat_document({1, 2, 3, 9}, {R::prompt, R::prompt, R::last_reply, R::last_reply}));
    writer.add_document(chat_document(
        {4, 5, 6, 7, 9}, {R::prompt, R::reply, R::prompt, R::last_reply, R::last_reply}));
    writer.add_document({{8, 9}, {R::prompt, R::last_reply}, DocumentContent::instruction});
    // Text cannot join documents that have roles; a document's roles must match its ids.
    CHECK(contains(error_of([&] { writer.add_document(std::vector<int32_t>{1}); }),
                   "a text document cannot follow"));
    CHECK(contains(error_of([&] {
                     writer.add_document(chat_document({1, 2}, {R::prompt}));
                   }),
                   "has 2 ids and 1 roles"));
    CHECK(contains(error_of([&] { writer.add_document(chat_document({}, {})); }), "is empty"));
    const TokenFileHeader h = writer.finish();
    CHECK(h.has_roles);
    CHECK(h.content ==
          (content_bit(DocumentContent::chat) | content_bit(DocumentContent::instruction)));
  }
  CHECK_FALSE(fs::exists(path + ".roles.tmp"));
  const TokenFile file(path);
  CHECK(file.header().version == 2);
  CHECK(content_names(file.header().content) == "instruction + chat");
  CHECK(file.read_all() == std::vector<int32_t>{1, 2, 3, 9, 4, 5, 6, 7, 9, 8, 9});
  REQUIRE(file.roles() != nullptr);
  const std::vector<R> roles(file.roles(), file.roles() + file.size());
  CHECK(roles == std::vector<R>{R::prompt, R::prompt, R::last_reply, R::last_reply, R::prompt,
                                R::reply, R::prompt, R::last_reply, R::last_reply, R::prompt,
                                R::last_reply});
  CHECK(std::vector<uint64_t>(file.document_starts().begin(), file.document_starts().end()) ==
        std::vector<uint64_t>{0, 4, 9, 11});
  // 11 ids of 4 bytes (44, padded to 48), 4 starts, 11 roles.
  CHECK(fs::file_size(path) == kTokenFileHeaderBytes + 48 + 32 + 11);

  // Damage: a role out of range, starts that do not rise, a cut file; each named.
  const std::string bytes = read_bytes(path);
  const std::string bad = dir.file("bad.tok");
  std::string damaged = bytes;
  damaged[bytes.size() - 1] = 3;
  write_text(bad, damaged);
  CHECK(contains(error_of([&] { TokenFile t(bad); }), "token 10 has role 3"));
  damaged = bytes;
  const uint64_t backwards = 10;  // document 1 would start after document 2
  std::memcpy(damaged.data() + kTokenFileHeaderBytes + 48 + 8, &backwards, 8);
  write_text(bad, damaged);
  CHECK(contains(error_of([&] { TokenFile t(bad); }), "document 1 starts at token 10"));
  write_text(bad, bytes.substr(0, bytes.size() - 1));
  CHECK(contains(error_of([&] { TokenFile t(bad); }), "truncated"));
  damaged = bytes;
  damaged[52] = 0;  // flags: roles gone, content still chat
  write_text(bad, damaged);
  CHECK(contains(error_of([&] { TokenFile t(bad); }), "without token roles"));
  // Header ids outside the vocabulary (a file that would make generation read past the table).
  damaged = bytes;
  const int32_t eos = 70000, bos = -2;
  std::memcpy(damaged.data() + 40, &eos, 4);
  write_text(bad, damaged);
  CHECK(contains(error_of([&] { TokenFile t(bad); }), "has eos id 70000, outside the vocabulary"));
  damaged = bytes;
  std::memcpy(damaged.data() + 36, &bos, 4);
  write_text(bad, damaged);
  CHECK(contains(error_of([&] { read_token_file_header(bad); }), "has bos id -2"));
}

TEST_CASE("token files of version 1 still read: text, without starts", "[data][token_file]") {
  TempDir dir;
  const std::string path = dir.file("v1.tok");
  write_text(path, version1_file({1, 5, 6, 2, 1, 7, 2}, 512, 1, 2, 2));
  const TokenFile file(path);
  CHECK(file.header().version == 1);
  CHECK(file.header().content == content_bit(DocumentContent::text));
  CHECK(file.read_all() == std::vector<int32_t>{1, 5, 6, 2, 1, 7, 2});
  CHECK(file.roles() == nullptr);
  CHECK(file.document_starts().empty());
  // Header ids outside the vocabulary are refused in version 1 files too (issue 51: 2046338
  // accepted an eos past the vocabulary and a bos below -1).
  const std::string bad = dir.file("bad_v1.tok");
  write_text(bad, version1_file({1, 5, 2}, 512, 1, 600, 1));
  CHECK(contains(error_of([&] { TokenFile t(bad); }), "has eos id 600, outside the vocabulary"));
  write_text(bad, version1_file({1, 5, 2}, 512, -3, 2, 1));
  CHECK(contains(error_of([&] { read_token_file_header(bad); }), "has bos id -3"));
  // A sampler over it trains on every target, as before.
  BatchSampler sampler(file.view(), {.seq_len = 3, .micro_batch_size = 2, .seed = 1});
  CHECK(sampler.next().target_tokens == 6);
}

TEST_CASE("sampler: targets whose role is not trained are ignored, counted per batch",
          "[data][sampler]") {
  // 21 tokens: roles cycle prompt, reply, last_reply.
  const auto tokens = ramp_tokens(21);
  std::vector<TokenRole> roles(tokens.size());
  for (size_t i = 0; i < roles.size(); ++i) roles[i] = TokenRole(i % 3);
  for (const TrainedRoles trained :
       {kEveryRole, TrainedRoles(role_bit(TokenRole::reply) | role_bit(TokenRole::last_reply)),
        role_bit(TokenRole::last_reply)}) {
    BatchSampler sampler(view_of(tokens), {.seq_len = 4, .micro_batch_size = 5, .seed = 3},
                         {roles.data(), trained});
    const TokenBatch batch = sampler.next();
    const std::vector<int32_t> inputs = as_vector(batch.inputs), targets = as_vector(batch.targets);
    int64_t counted = 0;
    for (size_t j = 0; j < targets.size(); ++j) {
      // The target of input token t is token t + 1 (values are positions).
      const int32_t t = inputs[j] + 1;
      const bool trained_role = (trained >> uint8_t(roles[size_t(t)])) & 1u;
      CHECK(targets[j] == (trained_role ? t : kIgnoreTarget));
      counted += trained_role;
    }
    CHECK(batch.target_tokens == counted);
  }
  // The evaluation iterator masks the same way.
  EvalIterator it(view_of(tokens), 4, 5, 0, 1, 0, {roles.data(), role_bit(TokenRole::prompt)});
  TokenBatch batch;
  REQUIRE(it.next(batch));
  const std::vector<int32_t> targets = as_vector(batch.targets);
  for (int32_t t : targets) CHECK((t == kIgnoreTarget || t % 3 == 0));
  CHECK(batch.target_tokens == 6);  // targets 3, 6, ..., 18 of the 20
}

TEST_CASE("data.train_on: what each mode trains, refused where it does not apply",
          "[data][train_on]") {
  const uint32_t text = content_bit(DocumentContent::text);
  const uint32_t chat = content_bit(DocumentContent::chat);
  const uint32_t instruction = content_bit(DocumentContent::instruction);
  const TrainedRoles replies = role_bit(TokenRole::reply) | role_bit(TokenRole::last_reply);
  CHECK(trained_roles(TrainOn::automatic, text, "t") == kEveryRole);
  CHECK(trained_roles(TrainOn::automatic, chat, "t") == replies);
  CHECK(trained_roles(TrainOn::automatic, instruction, "t") == replies);
  CHECK(trained_roles(TrainOn::assistant, chat, "t") == replies);
  CHECK(trained_roles(TrainOn::last_turn, chat, "t") == role_bit(TokenRole::last_reply));
  CHECK(trained_roles(TrainOn::completion, instruction, "t") == replies);
  CHECK(trained_roles(TrainOn::all, chat, "t") == kEveryRole);
  CHECK(contains(error_of([&] { trained_roles(TrainOn::assistant, instruction, "d/train.tok"); }),
                 "'d/train.tok' holds instruction data without conversations (use completion"));
  CHECK(contains(error_of([&] { trained_roles(TrainOn::completion, chat, "d/train.tok"); }),
                 "(use assistant or last_turn, or all)"));
  CHECK(contains(error_of([&] { trained_roles(TrainOn::last_turn, text, "d/train.tok"); }),
                 "nothing in it marks a prompt"));
  const std::vector<TokenRole> roles = {TokenRole::prompt, TokenRole::reply, TokenRole::last_reply,
                                        TokenRole::reply};
  CHECK(count_trained(roles.data(), roles.size(), replies) == 3);
  CHECK(count_trained(roles.data(), roles.size(), role_bit(TokenRole::last_reply)) == 1);
  CHECK(count_trained(nullptr, 7, role_bit(TokenRole::last_reply)) == 7);
}
