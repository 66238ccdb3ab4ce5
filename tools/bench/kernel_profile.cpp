// A CUDA injection library that times every kernel, copy and memset of a program with CUPTI's
// activity records and, at exit, writes where the GPU time went: by kernel family and by
// kernel; where the GPU idled between them (and after what); the memsets by size and what ran
// right after each (which tells a library's own from the program's); and the host's time in
// CUDA runtime calls, by function. Any CUDA program can be profiled alike, frugal and PyTorch, in
// the same way:
//
//   CUDA_INJECTION64_PATH=build-cuda/libfrugal_kernel_profile.so
//   FRUGAL_KERNEL_PROFILE=profile.json [FRUGAL_KERNEL_PROFILE_SKIP_S=20] PROGRAM ...
//
// (tools/bench/train_vs_torch PROFILE=DIR runs frugal and transformers so.) Without
// FRUGAL_KERNEL_PROFILE the JSON goes to stderr; under mpirun rank N > 0 writes PATH.rankN.
//
// The driver loads the library named by CUDA_INJECTION64_PATH when the program initialises
// CUDA and calls its InitializeInjection. Kernels that start within SKIP_S seconds of the first
// one are left out (start-up, warm-up steps). Nsight Systems is not on the GPU machine and ncu
// reads counters on only one of its runtimes; CUPTI's activity records (what PyTorch's own
// profiler uses) work on both.
//
// Families are matched on the demangled name, first rule first (kFamilies); a name that
// matches none counts as "other", and the JSON lists the kernels by time so that a rule can be
// added where "other" is large. Every record of the window is kept until the exit (for the
// idle gaps, 24 bytes each): meant for runs of minutes, not hours.
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Family {
  const char* name;
  std::vector<const char*> substrings;  // any of them, in the demangled name, lower case
};

// What frugal's kernels (kernels/cuda/) and PyTorch's are called, by what they do.
const std::vector<Family> kFamilies = {
    {"attention", {"flash", "attention", "attn", "fmha", "sdpa"}},
    {"nccl", {"nccl"}},
    {"gemm", {"gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "matmul", "wgmma"}},
    {"norm", {"rmsnorm", "rms_norm", "layer_norm", "norm_kernel"}},
    {"loss", {"cross_entropy", "log_softmax", "softmax", "nll_loss"}},
    {"optimizer", {"adam", "galore", "foreach", "multi_tensor"}},
    {"fp8", {"fp8", "e4m3", "e5m2", "amax", "float8"}},
    {"quant", {"nf4", "hqq", "dequant", "quant"}},
    {"rope", {"rope", "rotary"}},
    {"swiglu", {"swiglu", "silu"}},
    {"embedding", {"embedding", "gather", "index_select"}},
    {"reduce", {"reduce", "sum_squares", "norm_sq"}},
    {"elementwise",
     {"elementwise", "vectorized", "unrolled", "add", "copy", "convert", "cast", "scale", "fill",
      "zero", "mul"}},
};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const char* family_of(const std::string& name) {
  const std::string low = lower(name);
  for (const Family& f : kFamilies)
    for (const char* part : f.substrings)
      if (low.find(part) != std::string::npos) return f.name;
  return "other";
}

std::string demangled(const char* name) {
  if (!name) return "(unnamed)";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain ? plain : name;
  std::free(plain);
  // Template arguments make names long and say little here: cut at the first '<' or '(' of
  // the name proper (not of a return type or of "(anonymous namespace)").
  for (size_t at; (at = out.find("(anonymous namespace)::")) != std::string::npos;)
    out.erase(at, std::strlen("(anonymous namespace)::"));
  if (out.rfind("void ", 0) == 0) out.erase(0, 5);
  const size_t cut = out.find_first_of("<(");
  if (cut != std::string::npos && cut > 0) out.resize(cut);
  return out;
}

struct Totals {
  uint64_t count = 0, ns = 0, max_ns = 0;
};

// When the GPU worked (a kernel, copy or memset in the window), to find when it did not.
struct Busy {
  uint64_t start = 0, end = 0;
  uint32_t what = 0;  // index into Profile::busy_names
};

struct Profile {
  std::mutex mutex;
  std::map<std::string, Totals> kernels;  // by demangled name
  // The host's time in CUDA runtime calls, by function: where a host-bound phase waits
  // (synchronizations, blocking copies) or spends its launches.
  std::map<std::string, Totals> runtime_api;
  std::vector<Busy> busy;
  std::vector<std::string> busy_names;
  std::map<std::string, uint32_t> busy_ids;
  Totals memcpy_h2d, memcpy_d2h, memcpy_other, memset;
  std::map<uint64_t, Totals> memset_sizes;  // by bytes set: who issues them is not recorded
  uint64_t first_start = 0, window_start = 0, window_end = 0, skip_ns = 0;
  uint64_t dropped = 0;
  uint64_t seen = 0, skipped = 0;  // records delivered, and those before the window
  pid_t pid = 0;                   // the profiled process (a forked child writes nothing)
  CUpti_SubscriberHandle subscriber = nullptr;
};
Profile& profile() {
  static Profile* p = new Profile;  // never destroyed: the exit handler reads it
  return *p;
}

void add_busy(Profile& p, uint64_t start, uint64_t end, const std::string& what) {
  auto [it, added] = p.busy_ids.emplace(what, uint32_t(p.busy_names.size()));
  if (added) p.busy_names.push_back(what);
  p.busy.push_back({start, end, it->second});
}

// Whether a record that starts at `start` counts; widens the window to [.., end].
bool counts(Profile& p, uint64_t start, uint64_t end) {
  ++p.seen;
  if (p.first_start == 0 || start < p.first_start) p.first_start = start;
  if (start < p.first_start + p.skip_ns) {
    ++p.skipped;
    return false;
  }
  if (p.window_start == 0 || start < p.window_start) p.window_start = start;
  p.window_end = std::max(p.window_end, end);
  return true;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = *buffer ? kBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      if (!counts(p, k->start, k->end)) continue;
      const std::string name = demangled(k->name);
      Totals& t = p.kernels[name];
      ++t.count;
      t.ns += k->end - k->start;
      add_busy(p, k->start, k->end, name);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      if (!counts(p, m->start, m->end)) continue;
      Totals& t = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? p.memcpy_h2d
                  : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? p.memcpy_d2h
                                                                   : p.memcpy_other;
      ++t.count;
      t.ns += m->end - m->start;
      add_busy(p, m->start, m->end,
               m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "(copy host to device)"
               : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "(copy device to host)"
                                                                : "(copy)");
    } else if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      // Counted in the same window as the GPU's records, without widening it.
      if (p.first_start == 0 || a->start < p.first_start + p.skip_ns) continue;
      const char* name = nullptr;
      if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS ||
          !name)
        name = "(unknown)";
      Totals& t = p.runtime_api[name];
      ++t.count;
      t.ns += a->end - a->start;
      t.max_ns = std::max<uint64_t>(t.max_ns, a->end - a->start);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      if (!counts(p, m->start, m->end)) continue;
      ++p.memset.count;
      p.memset.ns += m->end - m->start;
      Totals& sized = p.memset_sizes[m->bytes];
      ++sized.count;
      sized.ns += m->end - m->start;
      add_busy(p, m->start, m->end, "(memset)");
    }
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, stream, &dropped) == CUPTI_SUCCESS)
    p.dropped += dropped;
  std::free(buffer);
}

void write_json(FILE* out, const char* key, const Totals& t, bool comma = true) {
  std::fprintf(out, "  \"%s\": {\"count\": %llu, \"ms\": %.3f}%s\n", key,
               static_cast<unsigned long long>(t.count), t.ns * 1e-6, comma ? "," : "");
}

// A name as a JSON string's contents (kernel names hold no control characters).
std::string json_safe(std::string name) {
  for (char& c : name)
    if (c == '"' || c == '\\') c = '\'';
  return name;
}

// "key": [{name, count, ms, max_ms}, ...], the `limit` largest by time first.
void write_ranked(FILE* out, const char* key, const std::map<std::string, Totals>& totals,
                  size_t limit, bool comma) {
  std::vector<std::pair<std::string, Totals>> v(totals.begin(), totals.end());
  std::sort(v.begin(), v.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  if (v.size() > limit) v.resize(limit);
  std::fprintf(out, "  \"%s\": [\n", key);
  for (size_t k = 0; k < v.size(); ++k)
    std::fprintf(out, "    {\"name\": \"%s\", \"count\": %llu, \"ms\": %.3f, \"max_ms\": %.3f}%s\n",
                 json_safe(v[k].first).c_str(), static_cast<unsigned long long>(v[k].second.count),
                 v[k].second.ns * 1e-6, v[k].second.max_ns * 1e-6, k + 1 < v.size() ? "," : "");
  std::fprintf(out, "  ]%s\n", comma ? "," : "");
}

void write_profile() {
  // A child forked by the program (frugal's checkpoint checker) inherits this exit handler but
  // not the records: only the process that loaded the library writes.
  if (getpid() != profile().pid) return;
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  // A process that initialised CUDA but ran nothing on it (mpirun, with a CUDA-aware Open MPI)
  // must not overwrite the profile of the rank it launched, which ends before it.
  if (p.seen == 0) {
    std::fprintf(stderr, "kernel_profile: pid %d recorded nothing on the GPU: no profile written\n",
                 int(getpid()));
    return;
  }
  // Under mpirun every rank has its own file: rank 0 the one named, rank N PATH.rankN.
  std::string path =
      std::getenv("FRUGAL_KERNEL_PROFILE") ? std::getenv("FRUGAL_KERNEL_PROFILE") : "";
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!path.empty() && rank && std::atoi(rank) > 0) path += std::string(".rank") + rank;
  FILE* out = path.empty() ? stderr : std::fopen(path.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "kernel_profile: cannot write '%s'\n", path.c_str());
    return;
  }
  std::map<std::string, Totals> families;
  uint64_t kernel_ns = 0;
  for (const auto& [name, t] : p.kernels) {
    Totals& f = families[family_of(name)];
    f.count += t.count;
    f.ns += t.ns;
    kernel_ns += t.ns;
  }
  std::vector<std::pair<std::string, Totals>> by_time(p.kernels.begin(), p.kernels.end());
  std::sort(by_time.begin(), by_time.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  std::fprintf(out,
               "{\n  \"window_ms\": %.3f,\n  \"kernel_ms\": %.3f,\n  \"dropped\": %llu,\n"
               "  \"records_seen\": %llu,\n  \"records_skipped\": %llu,\n",
               (p.window_end - p.window_start) * 1e-6, kernel_ns * 1e-6,
               static_cast<unsigned long long>(p.dropped), static_cast<unsigned long long>(p.seen),
               static_cast<unsigned long long>(p.skipped));
  // An empty profile after records is a window that skipped the whole run: say so.
  if (kernel_ns == 0)
    std::fprintf(stderr,
                 "kernel_profile: no kernel counted (%llu records delivered, %llu of them within "
                 "the first %.1f s that FRUGAL_KERNEL_PROFILE_SKIP_S leaves out)\n",
                 static_cast<unsigned long long>(p.seen),
                 static_cast<unsigned long long>(p.skipped), p.skip_ns * 1e-9);
  write_json(out, "memcpy_h2d", p.memcpy_h2d);
  write_json(out, "memcpy_d2h", p.memcpy_d2h);
  write_json(out, "memcpy_other", p.memcpy_other);
  write_json(out, "memset", p.memset);
  // The most frequent memset sizes, which tell apart the callers that set whole gradients from
  // the small flags and counters.
  std::vector<std::pair<uint64_t, Totals>> sizes(p.memset_sizes.begin(), p.memset_sizes.end());
  std::sort(sizes.begin(), sizes.end(),
            [](const auto& a, const auto& b) { return a.second.count > b.second.count; });
  sizes.resize(std::min<size_t>(sizes.size(), 12));
  std::fprintf(out, "  \"memset_sizes\": [");
  for (size_t k = 0; k < sizes.size(); ++k)
    std::fprintf(out, "%s{\"bytes\": %llu, \"count\": %llu, \"ms\": %.3f}", k ? ", " : "",
                 static_cast<unsigned long long>(sizes[k].first),
                 static_cast<unsigned long long>(sizes[k].second.count), sizes[k].second.ns * 1e-6);
  std::fprintf(out, "],\n");
  std::fprintf(out, "  \"families\": {\n");
  size_t i = 0;
  for (const auto& [name, t] : families)
    std::fprintf(out, "    \"%s\": {\"count\": %llu, \"ms\": %.3f, \"share\": %.4f}%s\n",
                 name.c_str(), static_cast<unsigned long long>(t.count), t.ns * 1e-6,
                 kernel_ns ? double(t.ns) / double(kernel_ns) : 0.0,
                 ++i < families.size() ? "," : "");
  std::fprintf(out, "  },\n  \"kernels\": [\n");
  for (size_t k = 0; k < by_time.size(); ++k) {
    std::fprintf(out,
                 "    {\"name\": \"%s\", \"family\": \"%s\", \"count\": %llu, \"ms\": %.3f}%s\n",
                 json_safe(by_time[k].first).c_str(), family_of(by_time[k].first),
                 static_cast<unsigned long long>(by_time[k].second.count),
                 by_time[k].second.ns * 1e-6, k + 1 < by_time.size() ? "," : "");
  }
  // Where the GPU idled inside the window: the gaps between the end of all work so far and the
  // next start, charged to the work that ended last before it (what the GPU waited after) and
  // to the work that began it (what it waited for). A host-bound phase shows up here.
  std::sort(p.busy.begin(), p.busy.end(),
            [](const Busy& a, const Busy& b) { return a.start < b.start; });
  std::map<std::string, Totals> idle_after, idle_before;
  uint64_t idle_ns = 0, covered = 0;
  uint32_t last = 0;
  for (size_t i = 0; i < p.busy.size(); ++i) {
    const Busy& b = p.busy[i];
    if (i > 0 && b.start > covered) {
      const uint64_t gap = b.start - covered;
      idle_ns += gap;
      for (Totals* t : {&idle_after[p.busy_names[last]], &idle_before[p.busy_names[b.what]]}) {
        ++t->count;
        t->ns += gap;
        t->max_ns = std::max(t->max_ns, gap);
      }
    }
    if (i == 0 || b.end >= covered) {
      covered = b.end;
      last = b.what;
    }
  }
  // What the GPU ran right after each memset (and the idle time between): a library's own
  // memsets (a GEMM's flags) show up as its kernels, the program's as whatever reads the
  // cleared buffer.
  std::map<std::string, Totals> after_memset;
  for (size_t i = 0; i + 1 < p.busy.size(); ++i) {
    const Busy &set = p.busy[i], &next = p.busy[i + 1];
    if (p.busy_names[set.what] != "(memset)") continue;
    Totals& t = after_memset[p.busy_names[next.what]];
    ++t.count;
    const uint64_t gap = next.start > set.end ? next.start - set.end : 0;
    t.ns += gap;
    t.max_ns = std::max(t.max_ns, gap);
  }
  std::fprintf(out, "  ],\n  \"idle_ms\": %.3f,\n", idle_ns * 1e-6);
  write_ranked(out, "after_memset", after_memset, 12, true);
  write_ranked(out, "idle_after", idle_after, 20, true);
  write_ranked(out, "idle_before", idle_before, 20, true);
  write_ranked(out, "runtime_api", p.runtime_api, p.runtime_api.size(), false);
  std::fprintf(out, "}\n");
  if (out != stderr) std::fclose(out);
  std::fprintf(stderr, "kernel_profile: pid %d: %zu kernels, %.1f ms of kernel time -> %s\n",
               int(getpid()), p.kernels.size(), kernel_ns * 1e-6,
               path.empty() ? "stderr" : path.c_str());
}

// Records of a context are lost once it is destroyed unflushed (a program that tears CUDA down
// before the exit handlers run): flush them as it goes.
void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void*) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

bool check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return true;
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  std::fprintf(stderr, "kernel_profile: %s: %s (no profile)\n", what, text ? text : "?");
  return false;
}

}  // namespace

extern "C" int InitializeInjection(void) {
  if (const char* skip = std::getenv("FRUGAL_KERNEL_PROFILE_SKIP_S"))
    profile().skip_ns = uint64_t(std::max(0.0, std::atof(skip)) * 1e9);
  if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
             "cuptiActivityRegisterCallbacks"))
    return 1;
  bool ok =
      check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
  ok = ok && check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enabling copy records");
  ok = ok && check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enabling memset records");
  ok =
      ok && check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enabling runtime API records");
  // Full buffers are handed over every second rather than when CUPTI's heuristics choose.
  ok = ok && check(cuptiActivityFlushPeriod(1000), "setting the flush period");
  ok = ok && check(cuptiSubscribe(&profile().subscriber, on_resource, nullptr), "subscribing");
  ok = ok && check(cuptiEnableCallback(1, profile().subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                                       CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING),
                   "enabling the context-destroy callback");
  profile().pid = getpid();
  if (ok) std::atexit(write_profile);
  return 1;
}
