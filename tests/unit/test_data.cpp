// The data layer: corpus readers, JSONL errors, token files, the sampler (determinism,
// resume, rank split) and tokenizer training (round trip, determinism).
#include <unistd.h>

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
  CHECK(corpus.documents == expected);
  CHECK(corpus.stats.documents == 6);
  CHECK(corpus.stats.files == 5);          // a_text, b_fortunes, blank, c.jsonl, latin1
  CHECK(corpus.stats.skipped_files == 3);  // .dat, the .u8 link, image.bin
  CHECK(corpus.stats.skipped_invalid_utf8 == 1);
  CHECK(corpus.stats.skipped_empty == 1);

  // Forcing a format overrides detection.
  Corpus forced = read_corpus({dir.file("b_fortunes")}, CorpusFormat::text);
  CHECK(forced.documents == std::vector<std::string>{"one\n%\ntwo\n%\nthree\n"});

  // Explicit paths: a missing one, or a binary one, is an error naming it.
  CHECK(contains(error_of([&] { read_corpus({dir.file("nope")}); }), "nope' does not exist"));
  CHECK(contains(error_of([&] { read_corpus({dir.file("sub/image.bin")}); }), "looks binary"));
  CHECK(corpus_format_from_name("jsonl") == CorpusFormat::jsonl);
  CHECK(contains(error_of([] { corpus_format_from_name("xml"); }), "'xml'"));
}

TEST_CASE("JSONL: text and alpaca records, errors name the line", "[data][corpus]") {
  const std::string good =
      "{\"text\": \"plain\"}\n"
      "{\"instruction\": \"Add.\", \"input\": \"1 2\", \"output\": \"3\"}\n"
      "\n"
      "{\"instruction\": \"Greet.\", \"output\": \"Hi\"}\n";
  const auto docs = parse_jsonl(good, "g.jsonl");
  REQUIRE(docs.size() == 3);
  CHECK(docs[0] == "plain");
  CHECK(docs[1] == alpaca_prompt("Add.", "1 2") + "3");
  CHECK(contains(docs[1], "### Input:\n1 2\n\n### Response:\n3"));
  CHECK(docs[2] == alpaca_prompt("Greet.", "") + "Hi");
  CHECK_FALSE(contains(docs[2], "### Input"));

  const std::string bad = "{\"text\": \"ok\"}\n{\"text\": \"fine\"}\n{\"text\": oops}\n";
  const std::string msg = error_of([&] { parse_jsonl(bad, "data/bad.jsonl"); });
  CHECK(contains(msg, "data/bad.jsonl:3: invalid JSON"));
  CHECK(contains(error_of([] { parse_jsonl("{\"title\": \"x\"}\n", "f.jsonl"); }),
                 "f.jsonl:1: expected a \"text\" field"));
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
  CHECK(read_corpus({dir.file("a.json")}).documents ==
        std::vector<std::string>{alpaca_prompt("I", "") + "O"});
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
  CHECK(fs::file_size(path) == kTokenFileHeaderBytes + 2 * written.num_tokens);
  CHECK_FALSE(fs::exists(path + ".tmp"));

  TokenFile file(path);
  CHECK(file.header().vocab_size == 512);
  CHECK(file.header().bos_id == 1);
  CHECK(file.header().eos_id == 2);
  CHECK(file.read_all() == std::vector<int32_t>{1, 5, 6, 7, 2, 1, 2, 1, 300, 4, 2});
  CHECK(file[8] == 300);
  CHECK(read_token_file_header(path).num_tokens == 11);

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
  corrupt[kTokenFileHeaderBytes + 2 * 3] = '\xff';  // id 7 -> 0x??ff >= 512
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
