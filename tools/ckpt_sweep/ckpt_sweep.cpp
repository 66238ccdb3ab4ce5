// ckpt_sweep: flips bits of a checkpoint rank file, one flip at a time, and checks what frugal
// makes of each: the check of `frugal ckpt verify` (check_step) and a resume
// (CheckpointManager::resume, in a child process). Every flip must end in one of: verify
// accepts it and the resume loads the step with the clean values, or verify refuses it by name
// and the resume falls back to the older step, again with that step's clean values. Anything
// else (wrong values, a resume that crashes or errs, verify and resume disagreeing) is a
// failure, and the exit status is 1.
//
// usage: ckpt_sweep CKPT_DIR [RANGE...] [--every K] [--metadata-every K] [--data-every K]
//                   [--signatures N] [--jobs N] [--resume-every K] [--time-limit S]
//                   [--examples FILE] [--part K/N] [--variable-length-strings] [--index]
//                   [--odd-files]
//   CKPT_DIR  a run's ckpt/ directory, saved by one rank, with two committed steps or more;
//             the newest step's rank_00000.h5 is swept (and restored after each flip)
//   --index   sweep the newest step's index.h5 instead (all of it is metadata: a virtual
//             dataset stores no data of its own). verify's outcome then tells which check
//             refused a flip: HDF5 crashing, hanging or erring in the checking child, or HDF5
//             reading it fine and only the CRC32C in COMMITTED catching it ("checksum")
//   --odd-files  also (or only, without a range or region) puts something other than a regular
//             file at every path of the checkpoint frugal reads (LATEST; each committed step's
//             directory and every file in it), one at a time and each of: a FIFO, a
//             directory, a symlink loop, /dev/zero through a symlink, a dangling symlink; and
//             checks verify's check (in a child given the time limit: a hang is a failure) and
//             a resume as for flips, and that a refusal names the path
//   RANGE     START:END byte offsets of that file (negative: from its end; END 0: its end)
//   --every K one bit in K of the ranges (default 1: every bit)
//   --metadata-every K  also one bit in K of the file's metadata region: every byte outside
//             the datasets' stored bytes (HDF5's superblock, object headers, B-trees, heaps,
//             attribute values, the manifest, free space), found by asking HDF5 where each
//             dataset's chunks lie (H5Reader::dataset_storage)
//   --data-every K      also one bit in K of the data region (the datasets' chunks). An odd K
//             meets every bit position of a byte; a multiple of 8 would flip bit 0 only.
//             The full sweep: --metadata-every 1 --data-every 63 (tests/integration/ckpt_sweep.sh
//             with CKPT_SWEEP_FULL=1).
//   --jobs N  N worker processes, each on its own copy of CKPT_DIR (default 1)
//   --resume-every K  resumes after one flip in K only (default 1: after every flip), the one
//             of each K flips in a row moving along (flips K*b + (b % K)), so that every bit
//             position gets resumed; verify runs on every flip. For the full sweep, where
//             resuming after each of nearly a million flips would take hours on two cores.
//   --examples FILE  writes "OFFSET BIT OUTCOME" for up to 5 flips of each outcome
//   --part K/N       sweeps the K-th of N interleaved parts of the chosen flips (flips K-1,
//             K-1+N, ...), each with its own summary: a long sweep run in several sittings
//   --signatures N   also the first N bytes of every HDF5 metadata structure (found by its
//             signature: object headers, B-tree nodes, heaps), where flips make HDF5 crash or
//             hang; a range given twice is swept once
//   --time-limit S   how long a check's child may read before the file counts as one that
//             makes HDF5 hang (default 5 s: the file is small; frugal's default is a minute)
//   --variable-length-strings  first rewrites every string attribute of every committed step's
//             rank_00000.h5 as a variable-length string, values unchanged: the files frugal wrote
//             before 2026-12-02, whose strings lie in HDF5's global heap (where flips make HDF5
//             crash or hang). Without a range or region to sweep, only that rewrite.
// tests/integration/ckpt_sweep.sh runs a sample; doc/architecture.md (Checkpoints) has the
// full sweep's command and figures.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpoint_manager.h"
#include "ckpt/isolated.h"
#include "ckpt/step_check.h"
#include "core/error.h"
#include "core/log.h"
#include "tests/non_regular_files.h"

namespace fs = std::filesystem;
using namespace frugal;

namespace {

bool contains_text(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct Flip {
  int64_t offset;
  int bit;
};

// Every tensor of a step, as a part that a resume fills (one rank: whole rows).
struct AllTensors : Stateful {
  std::vector<std::string> names;
  std::vector<Tensor> tensors;
  std::vector<StateTensor> state_tensors() override {
    std::vector<StateTensor> out;
    for (size_t i = 0; i < names.size(); ++i)
      out.push_back({names[i], tensors[i], whole_rows(tensors[i].shape(), false)});
    return out;
  }
};

// The clean contents of one step: its manifest and tensors, by name.
struct CleanStep {
  nlohmann::json manifest;
  std::map<std::string, Tensor> tensors;
};

// Every string attribute of `path` (on any object, the root group included) rewritten as a
// variable-length UTF-8 string, as frugal's writer stored them before 2026-12-02.
void make_strings_variable_length(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) fail("cannot open '", path, "' to rewrite its strings");
  std::vector<std::string> objects = {"/"};
  const auto collect = [](hid_t, const char* name, const H5O_info_t*, void* data) -> herr_t {
    if (std::string(name) != ".") static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  bool ok = H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, collect, &objects) >= 0;
  for (const std::string& object_name : objects) {
    const hid_t object = H5Oopen(file, object_name.c_str(), H5P_DEFAULT);
    std::vector<std::string> names;
    const auto on_attribute = [](hid_t o, const char* name, const H5A_info_t*, void* data) {
      const hid_t attr = H5Aopen(o, name, H5P_DEFAULT);
      const hid_t type = H5Aget_type(attr);
      if (H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) == 0)
        static_cast<std::vector<std::string>*>(data)->push_back(name);
      H5Tclose(type);
      H5Aclose(attr);
      return herr_t(0);
    };
    hsize_t at = 0;
    ok = ok && object >= 0 &&
         H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_NATIVE, &at, on_attribute, &names) >= 0;
    for (const std::string& name : names) {
      const hid_t attr = H5Aopen(object, name.c_str(), H5P_DEFAULT);
      const hid_t fixed = H5Aget_type(attr);
      std::string value(H5Tget_size(fixed), '\0');
      ok = ok && H5Aread(attr, fixed, value.data()) >= 0;
      value.erase(value.find_last_not_of('\0') + 1);
      H5Tclose(fixed);
      H5Aclose(attr);
      const hid_t type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, H5T_VARIABLE);
      H5Tset_cset(type, H5T_CSET_UTF8);
      const hid_t space = H5Screate(H5S_SCALAR);
      ok = ok && H5Adelete(object, name.c_str()) >= 0;
      const hid_t created = H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
      const char* text = value.c_str();
      ok = ok && created >= 0 && H5Awrite(created, type, &text) >= 0;
      if (created >= 0) H5Aclose(created);
      H5Sclose(space);
      H5Tclose(type);
    }
    if (object >= 0) H5Oclose(object);
  }
  if (H5Fclose(file) < 0 || !ok) fail("cannot rewrite the strings of '", path, "'");
}

CleanStep read_clean(const CheckpointDir& dir, int64_t step) {
  CleanStep clean;
  clean.manifest = dir.manifest(step);
  const H5Reader reader(dir.rank_file(step, 0));
  for (const std::string& name : reader.tensor_names())
    clean.tensors.emplace(name, reader.read_tensor(name));
  return clean;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// A resume on one rank in this process; returns the step it resumed from, after checking that
// the part holds exactly that step's clean values (else an Error).
int64_t resume_and_compare(const CheckpointDir& dir, const std::map<int64_t, CleanStep>& clean) {
  const CleanStep& newest = clean.rbegin()->second;
  AllTensors part;
  for (const auto& [name, t] : newest.tensors) {
    part.names.push_back(name);
    part.tensors.push_back(Tensor::zeros(t.shape(), t.dtype()));
  }
  CheckpointManager manager(
      dir, 0, 1, [](bool ok) { return ok; }, {{"all", &part}}, 1 << 20);
  const int64_t step = manager.resume();
  auto it = clean.find(step);
  if (it == clean.end()) fail("resumed from step ", step, ", which is not a clean step");
  for (size_t i = 0; i < part.names.size(); ++i)
    if (!same_bits(part.tensors[i], it->second.tensors.at(part.names[i])))
      fail("WRONG VALUES: step ", step, " tensor ", part.names[i], " differs from the clean one");
  return step;
}

void flip_bit(const std::string& path, const Flip& f) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) fail("cannot open ", path);
  unsigned char byte = 0;
  if (::pread(fd, &byte, 1, f.offset) != 1) fail("cannot read ", path);
  byte ^= static_cast<unsigned char>(1u << f.bit);
  if (::pwrite(fd, &byte, 1, f.offset) != 1) fail("cannot write ", path);
  ::close(fd);
}

// One flip: what verify and a resume make of it, as "verify:<v> resume:<r>".
// `checker`: the worker's child that reads the files, flip after flip.
std::string try_flip(RankFileChecker& checker, const CheckpointDir& dir, const std::string& path,
                     const Flip& flip, const std::map<int64_t, CleanStep>& clean,
                     bool resume_this) {
  const int64_t newest = clean.rbegin()->first;
  flip_bit(path, flip);
  const StepCheck check = check_step(checker, dir, newest);
  std::string verify = "ok";
  if (!check.ok()) {
    verify = contains_text(check.error, "crashed")          ? "refused(HDF5 crashed)"
             : contains_text(check.error, "did not finish") ? "refused(HDF5 hung)"
             : contains_text(check.error, "its CRC32C is")  ? "refused(checksum)"
                                                            : "refused(error)";
  }
  if (!resume_this) {
    flip_bit(path, flip);  // restored
    return "verify:" + verify + " resume:not run";
  }
  const IsolatedOutcome resumed = run_isolated(
      [&] {
        // The resume's own messages are not the sweep's.
        const int null = ::open("/dev/null", O_WRONLY);
        ::dup2(null, 1);
        ::dup2(null, 2);
        return std::to_string(resume_and_compare(dir, clean));
      },
      600);
  flip_bit(path, flip);  // restored
  std::string resume;
  if (!resumed.ok)
    resume = resumed.crashed ? "CRASHED" : resumed.timed_out ? "HUNG" : "ERROR: " + resumed.text;
  else if (std::stoll(resumed.text) == newest)
    resume = "newest";
  else
    resume = "older";
  // Verify and resume apply the same rule: a refused step is never resumed, an accepted one is.
  const bool agree = (verify == "ok") == (resume == "newest");
  const bool good = agree && (resume == "newest" || resume == "older");
  return std::string(good ? "" : "BAD ") + "verify:" + verify + " resume:" + resume;
}

// The paths of `dir` that frugal reads, for --odd-files: LATEST, and each committed step's
// directory and every entry in it, relative to the root.
std::vector<std::string> read_paths(const CheckpointDir& dir, const std::vector<int64_t>& steps) {
  std::vector<std::string> paths = {"LATEST"};
  for (int64_t step : steps) {
    const std::string step_dir = fs::path(dir.step_dir(step)).filename().string();
    paths.push_back(step_dir);
    std::vector<std::string> inside;
    for (const auto& entry : fs::directory_iterator(dir.step_dir(step)))
      inside.push_back(step_dir + "/" + entry.path().filename().string());
    std::sort(inside.begin(), inside.end());
    paths.insert(paths.end(), inside.begin(), inside.end());
  }
  return paths;
}

// Something other than a regular file at each path frugal reads, one at a time: what verify's
// check and a resume make of it, one line each; false when any is bad. Verify's check runs in
// a child given `time_limit_s` per file and the whole check 10 times that, so a reader that
// blocks is a failure, not a hung sweep.
bool sweep_odd_files(const std::string& ckpt, const std::map<int64_t, CleanStep>& clean,
                     double time_limit_s) {
  const CheckpointDir pristine(ckpt);
  std::vector<int64_t> steps;
  for (const auto& [step, unused] : clean) steps.insert(steps.begin(), step);  // newest first
  const int64_t newest = steps.front();
  const std::vector<std::string> paths = read_paths(pristine, steps);
  const fs::path copy =
      fs::temp_directory_path() / ("ckpt_sweep_odd_" + std::to_string(::getpid()));
  fs::remove_all(copy);
  fs::copy(ckpt, copy, fs::copy_options::recursive);
  CheckpointDir dir(copy.string());
  dir.set_check_time_limit(time_limit_s);
  std::printf("ckpt_sweep: odd files at %zu paths of %s, %zu kinds each\n", paths.size(),
              ckpt.c_str(), test::odd_files().size());
  int bad = 0, cases = 0;
  for (const std::string& relative : paths)
    for (test::OddFile kind : test::odd_files()) {
      const fs::path path = copy / relative;
      test::make_odd_file(path.string(), kind);
      // verify's view of each step: accepted (""), or refused with a message.
      const IsolatedOutcome verified = run_isolated(
          [&] {
            const std::vector<int64_t> committed = dir.committed_steps();
            nlohmann::json refused = nlohmann::json::object();
            for (int64_t step : steps) {
              std::string why;
              for (const auto& [s, problem] : dir.incomplete_steps())
                if (s == step) why = problem;
              if (why.empty() &&
                  std::find(committed.begin(), committed.end(), step) == committed.end())
                why = "'" + dir.step_dir(step) + "' is not a committed step";
              if (why.empty()) why = check_step(dir, step).error;
              refused[std::to_string(step)] = why;
            }
            return nlohmann::json{{"refused", refused}, {"latest", dir.latest_problem()}}.dump();
          },
          time_limit_s * 10);
      const IsolatedOutcome resumed = run_isolated(
          [&] {
            const int null = ::open("/dev/null", O_WRONLY);
            ::dup2(null, 1);
            ::dup2(null, 2);
            return std::to_string(resume_and_compare(dir, clean));
          },
          time_limit_s * 10);
      // Put the original back.
      fs::remove_all(path);
      fs::copy(fs::path(ckpt) / relative, path, fs::copy_options::recursive);
      std::string verify, resume, why;
      bool good = verified.ok;
      if (!verified.ok) {
        verify = verified.timed_out ? "HUNG" : verified.crashed ? "CRASHED" : "ERROR";
        why = verified.text;
      } else {
        const nlohmann::json answer = nlohmann::json::parse(verified.text);
        const nlohmann::json& refused = answer.at("refused");
        verify = refused.at(std::to_string(newest)).get<std::string>().empty() ? "ok" : "refused";
        // The step the path belongs to: a refusal of it names the path; so does LATEST's
        // warning. The other step must be accepted.
        for (int64_t step : steps) {
          const std::string text = refused.at(std::to_string(step)).get<std::string>();
          const std::string step_dir = fs::path(dir.step_dir(step)).filename().string();
          const bool ours = relative.rfind(step_dir, 0) == 0;
          if (ours) why = text;
          if (ours ? !text.empty() && !contains_text(text, path.string()) : !text.empty())
            good = false;
          if (!ours && !text.empty()) why = "the other step refused: " + text;
        }
        if (relative == "LATEST") why = answer.at("latest").get<std::string>();
        if (relative == "LATEST" && !contains_text(why, path.string())) good = false;
      }
      if (!resumed.ok)
        resume = resumed.crashed     ? "CRASHED"
                 : resumed.timed_out ? "HUNG"
                                     : "ERROR: " + resumed.text;
      else
        resume = std::stoll(resumed.text) == newest ? "newest" : "older";
      good = good && (resume == "newest" || resume == "older") &&
             (verify == "ok") == (resume == "newest");
      bad += !good;
      ++cases;
      std::printf("  %s%-36s %-16s verify:%s resume:%s%s%s\n", good ? "" : "BAD ", relative.c_str(),
                  test::odd_file_name(kind), verify.c_str(), resume.c_str(),
                  why.empty() ? "" : "  -- ", printable(why, 160).c_str());
      std::fflush(stdout);
    }
  fs::remove_all(copy);
  std::printf("ckpt_sweep: %d odd-file cases, %s\n", cases,
              bad ? "FAILED (see the BAD lines)" : "every one handled");
  return bad == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string ckpt, examples_path;
  std::vector<std::pair<int64_t, int64_t>> ranges;        // START:END, END 0 = the end
  int64_t every = 1, metadata_every = 0, data_every = 0;  // 0: that region is not swept
  size_t resume_every = 1;
  int64_t signature_bytes = 0;
  double time_limit_s = 5;
  int jobs = 1;
  int64_t part = 1, parts = 1;
  bool variable_length_strings = false;
  bool sweep_index = false, odd_files = false;
  try {
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] == "--every" && i + 1 < args.size()) {
        every = std::stoll(args[++i]);
      } else if (args[i] == "--metadata-every" && i + 1 < args.size()) {
        metadata_every = std::stoll(args[++i]);
        if (metadata_every < 1) fail("--metadata-every ", metadata_every, " is not 1 or more");
      } else if (args[i] == "--data-every" && i + 1 < args.size()) {
        data_every = std::stoll(args[++i]);
        if (data_every < 1) fail("--data-every ", data_every, " is not 1 or more");
      } else if (args[i] == "--resume-every" && i + 1 < args.size()) {
        resume_every = std::stoull(args[++i]);
      } else if (args[i] == "--jobs" && i + 1 < args.size()) {
        jobs = std::stoi(args[++i]);
      } else if (args[i] == "--signatures" && i + 1 < args.size()) {
        signature_bytes = std::stoll(args[++i]);
      } else if (args[i] == "--time-limit" && i + 1 < args.size()) {
        time_limit_s = std::stod(args[++i]);
      } else if (args[i] == "--part" && i + 1 < args.size()) {
        const std::string text = args[++i];
        const size_t slash = text.find('/');
        if (slash == std::string::npos) fail("--part '", text, "' is not K/N");
        part = std::stoll(text.substr(0, slash));
        parts = std::stoll(text.substr(slash + 1));
        if (parts < 1 || part < 1 || part > parts) fail("--part '", text, "' needs 1 <= K <= N");
      } else if (args[i] == "--variable-length-strings") {
        variable_length_strings = true;
      } else if (args[i] == "--index") {
        sweep_index = true;
      } else if (args[i] == "--odd-files") {
        odd_files = true;
      } else if (args[i] == "--examples" && i + 1 < args.size()) {
        examples_path = args[++i];
      } else if (ckpt.empty()) {
        ckpt = args[i];
      } else {
        const size_t colon = args[i].find(':');
        if (colon == std::string::npos) fail("range '", args[i], "' is not START:END");
        ranges.emplace_back(std::stoll(args[i].substr(0, colon)),
                            std::stoll(args[i].substr(colon + 1)));
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "ckpt_sweep: " << e.what() << "\n";
    return 2;
  }
  const bool nothing_to_sweep =
      ranges.empty() && signature_bytes <= 0 && metadata_every == 0 && data_every == 0;
  if (ckpt.empty() || (nothing_to_sweep && !variable_length_strings && !odd_files) || every < 1 ||
      jobs < 1 || resume_every < 1 || !(time_limit_s > 0)) {
    std::cerr << "usage: ckpt_sweep CKPT_DIR [START:END...] [--every K] [--metadata-every K] "
                 "[--data-every K] [--signatures N] [--jobs N] [--resume-every K] "
                 "[--time-limit S] [--examples FILE] [--part K/N] [--variable-length-strings] "
                 "[--index] [--odd-files]\n";
    return 2;
  }
  try {
    set_log_quiet(true);
    CheckpointDir dir(ckpt);
    dir.set_check_time_limit(time_limit_s);
    const std::vector<int64_t> steps = dir.committed_steps();
    if (variable_length_strings)
      for (int64_t step : steps) make_strings_variable_length(dir.rank_file(step, 0));
    if (nothing_to_sweep && !odd_files) return 0;
    if (steps.size() < 2) fail("'", ckpt, "' needs two committed steps or more");
    std::map<int64_t, CleanStep> clean;
    for (int64_t step : steps) clean.emplace(step, read_clean(dir, step));
    if (clean.rbegin()->second.manifest.value("world_size", 0) != 1)
      fail("the newest step of '", ckpt, "' was not saved by one rank");
    // A clean resume loads the newest step, or the sweep would mean nothing.
    if (resume_and_compare(dir, clean) != steps.front())
      fail("a clean resume of '", ckpt, "' does not load its newest step");
    const bool odd_files_ok = !odd_files || sweep_odd_files(ckpt, clean, time_limit_s);
    if (nothing_to_sweep) return odd_files_ok ? 0 : 1;
    const std::string path =
        sweep_index ? dir.index_file(steps.front()) : dir.rank_file(steps.front(), 0);
    const auto size = int64_t(fs::file_size(path));
    if (signature_bytes > 0) {
      std::ifstream in(path, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      for (const char* signature : {"OHDR", "OCHK", "TREE", "HEAP", "SNOD", "GCOL", "FRHP", "FHDB",
                                    "FHIB", "BTHD", "BTIN", "BTLF", "FSHD", "FSSE", "SMTB", "SMLI"})
        for (size_t at = bytes.find(signature); at != std::string::npos;
             at = bytes.find(signature, at + 1))
          ranges.emplace_back(int64_t(at), int64_t(at) + signature_bytes);
    }
    // The two regions: the bytes HDF5 says hold datasets' chunks (data), the rest (metadata).
    std::vector<bool> is_data(size_t(size), false);
    int64_t chunks = 0;
    const std::vector<H5Reader::ByteRange> storage =
        sweep_index ? std::vector<H5Reader::ByteRange>() : H5Reader(path).dataset_storage();
    for (const H5Reader::ByteRange& r : storage) {
      if (r.offset < 0 || r.offset + r.bytes > size)
        fail("HDF5 places a chunk at ", r.offset, "+", r.bytes, ", outside ", path);
      std::fill(is_data.begin() + r.offset, is_data.begin() + r.offset + r.bytes, true);
      ++chunks;
    }
    const auto data_bytes = int64_t(std::count(is_data.begin(), is_data.end(), true));
    const int64_t metadata_bytes = size - data_bytes;
    std::printf(
        "ckpt_sweep: %s: %lld bytes: metadata %lld bytes (%lld bits), data %lld bytes "
        "in %lld chunks (%lld bits)\n",
        path.c_str(), static_cast<long long>(size), static_cast<long long>(metadata_bytes),
        static_cast<long long>(metadata_bytes * 8), static_cast<long long>(data_bytes),
        static_cast<long long>(chunks), static_cast<long long>(data_bytes * 8));
    // The bits to flip, file order, each once whatever selections overlap: one in `every` of
    // the ranges' bits (every byte of overlapping ranges counted once), one in metadata_every
    // of the metadata region's, one in data_every of the data region's.
    std::vector<bool> chosen(size_t(size) * 8, false);
    {
      std::vector<bool> in_ranges(size_t(size), false);
      for (auto [start, end] : ranges) {
        if (start < 0) start += size;
        if (end <= 0) end += size;
        for (int64_t offset = std::max<int64_t>(0, start); offset < std::min(size, end); ++offset)
          in_ranges[size_t(offset)] = true;
      }
      int64_t n_ranges = 0, n_metadata = 0, n_data = 0;
      for (int64_t offset = 0; offset < size; ++offset)
        for (int bit = 0; bit < 8; ++bit) {
          bool take = in_ranges[size_t(offset)] && n_ranges++ % every == 0;
          if (is_data[size_t(offset)])
            take |= data_every > 0 && n_data++ % data_every == 0;
          else
            take |= metadata_every > 0 && n_metadata++ % metadata_every == 0;
          chosen[size_t(offset) * 8 + size_t(bit)] = take;
        }
    }
    std::vector<Flip> flips;
    int64_t metadata_flips = 0, n_chosen = 0;
    for (int64_t offset = 0; offset < size; ++offset)
      for (int bit = 0; bit < 8; ++bit)
        if (chosen[size_t(offset) * 8 + size_t(bit)] && n_chosen++ % parts == part - 1) {
          flips.push_back({offset, bit});
          metadata_flips += !is_data[size_t(offset)];
        }
    const int64_t data_flips = int64_t(flips.size()) - metadata_flips;
    auto one_in = [](int64_t k) {
      return k == 1 ? std::string("every") : "1 in " + std::to_string(k);
    };
    std::string chosen_by;
    if (!ranges.empty()) chosen_by += ", " + one_in(every) + " bit of the ranges";
    if (metadata_every > 0) chosen_by += ", " + one_in(metadata_every) + " metadata bit";
    if (data_every > 0) chosen_by += ", " + one_in(data_every) + " data bit";
    if (parts > 1)
      chosen_by += ", part " + std::to_string(part) + " of " + std::to_string(parts) + " (of " +
                   std::to_string(n_chosen) + " flips)";
    std::printf(
        "ckpt_sweep: %zu flips (%s): %lld in metadata, %lld in data; verify after each "
        "flip, a resume after %s\n",
        flips.size(), chosen_by.substr(2).c_str(), static_cast<long long>(metadata_flips),
        static_cast<long long>(data_flips),
        resume_every == 1 ? "each" : one_in(int64_t(resume_every)).c_str());
    std::fflush(stdout);

    const auto start_time = std::chrono::steady_clock::now();
    // Workers: each takes flips j, j + jobs, ... on its own copy of the directory and answers
    // one line per flip, "INDEX OUTCOME".
    std::vector<std::string> outcomes(flips.size());
    std::vector<fs::path> copies;
    for (int j = 0; j < jobs; ++j) {
      const fs::path copy = fs::temp_directory_path() /
                            ("ckpt_sweep_" + std::to_string(::getpid()) + "_" + std::to_string(j));
      fs::remove_all(copy);
      fs::copy(ckpt, copy, fs::copy_options::recursive);
      copies.push_back(copy);
    }
    std::vector<IsolatedOutcome> results(static_cast<size_t>(jobs));
    {
      // The workers run side by side: each is a child of its own thread here.
      std::vector<std::thread> threads;
      for (int j = 0; j < jobs; ++j)
        threads.emplace_back([&, j] {
          results[size_t(j)] = run_isolated(
              [&] {
                CheckpointDir copy_dir(copies[size_t(j)].string());
                copy_dir.set_check_time_limit(time_limit_s);
                const std::string copy_path = sweep_index ? copy_dir.index_file(steps.front())
                                                          : copy_dir.rank_file(steps.front(), 0);
                RankFileChecker checker;
                std::string lines;
                for (size_t i = size_t(j); i < flips.size(); i += size_t(jobs)) {
                  if (j == 0 && i > 0 && i % 20000 < size_t(jobs)) {
                    const double s =
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time)
                            .count();
                    std::fprintf(stderr,
                                 "ckpt_sweep: %zu of %zu flips, %.0f s, %.0f flips/s, about "
                                 "%.0f min left\n",
                                 i, flips.size(), s, double(i) / s,
                                 double(flips.size() - i) / (double(i) / s) / 60);
                  }
                  // One flip of each K in a row, at a position that moves along: a bit-0-only
                  // sample when K is 8 would otherwise say nothing of the other bits.
                  const bool resume_this = i % resume_every == (i / resume_every) % resume_every;
                  lines += std::to_string(i) + " " +
                           try_flip(checker, copy_dir, copy_path, flips[i], clean, resume_this) +
                           "\n";
                }
                return lines;
              },
              1e9);
        });
      for (std::thread& t : threads) t.join();
    }
    for (const fs::path& copy : copies) fs::remove_all(copy);
    for (int j = 0; j < jobs; ++j) {
      if (!results[size_t(j)].ok) fail("worker ", j, " failed: ", results[size_t(j)].text);
      std::istringstream in(results[size_t(j)].text);
      std::string line;
      while (std::getline(in, line)) {
        const size_t space = line.find(' ');
        outcomes.at(std::stoull(line.substr(0, space))) = line.substr(space + 1);
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();

    std::map<std::string, int64_t> counts, metadata_counts;
    std::map<std::string, std::vector<size_t>> examples;
    int64_t bad = 0;
    for (size_t i = 0; i < flips.size(); ++i) {
      ++counts[outcomes[i]];
      if (!is_data[size_t(flips[i].offset)]) ++metadata_counts[outcomes[i]];
      if (examples[outcomes[i]].size() < 5) examples[outcomes[i]].push_back(i);
      if (outcomes[i].rfind("BAD", 0) == 0) ++bad;
    }
    std::printf("ckpt_sweep: %zu flips of %s (%lld bytes) in %.1f s (%d job(s))\n", flips.size(),
                path.c_str(), static_cast<long long>(size), seconds, jobs);
    for (const auto& [outcome, count] : counts) {
      std::printf("  %8lld  %s   e.g.", static_cast<long long>(count), outcome.c_str());
      for (size_t i : examples[outcome])
        std::printf(" %lld:%d", static_cast<long long>(flips[i].offset), flips[i].bit);
      std::printf("\n");
    }
    if (metadata_flips > 0 && data_flips > 0) {
      std::printf("ckpt_sweep: by region (metadata, data):\n");
      for (const auto& [outcome, count] : counts)
        std::printf("  %8lld %8lld  %s\n", static_cast<long long>(metadata_counts[outcome]),
                    static_cast<long long>(count - metadata_counts[outcome]), outcome.c_str());
    }
    if (!examples_path.empty()) {
      std::ofstream out(examples_path);
      for (const auto& [outcome, list] : examples)
        for (size_t i : list)
          out << flips[i].offset << " " << flips[i].bit << " " << outcome << "\n";
    }
    std::printf("ckpt_sweep: %s\n", bad ? "FAILED (see the BAD lines)" : "every flip handled");
    return bad || !odd_files_ok ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "ckpt_sweep: " << e.what() << "\n";
    return 1;
  }
}
