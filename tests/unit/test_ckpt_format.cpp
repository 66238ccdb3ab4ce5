// The rank files' string attributes on disk: new files hold them as fixed-length strings, so a
// file has no variable-length data and no global heap (the part of HDF5 1.10 that loops on
// damaged files); files of earlier versions, whose strings are variable-length, still load.
// The earlier writer is kept here only, to make such files.
#include <hdf5.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "ckpt/checkpoint_manager.h"
#include "ckpt/h5_file.h"
#include "ckpt/step_check.h"
#include "core/tensor.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;

namespace {

// A part with a sharded [3, 2] tensor, a replicated scalar-like [1] tensor and a counter.
struct Part : Stateful {
  Tensor rows = Tensor::zeros({3, 2});
  Tensor scale = Tensor::zeros({1});
  int64_t counter = 0;

  std::vector<StateTensor> state_tensors() override {
    return {{"part/rows", rows, whole_rows({3, 2}, false)},
            {"part/scale", scale, whole_rows({1}, true)}};
  }
  nlohmann::json state_values() const override { return {{"counter", counter}}; }
  void load_state_values(const nlohmann::json& values) override {
    counter = values.at("counter").get<int64_t>();
  }
  void set(float base) {
    for (int64_t i = 0; i < rows.numel(); ++i) rows.data<float>()[i] = base + 0.25f * float(i);
    scale.data<float>()[0] = -base;
    counter = int64_t(base);
  }
  bool holds(float base) const {
    for (int64_t i = 0; i < rows.numel(); ++i)
      if (rows.data<float>()[i] != base + 0.25f * float(i)) return false;
    return scale.data<float>()[0] == -base && counter == int64_t(base);
  }
};

bool one_rank(bool ok) { return ok; }

struct StringAttributes {
  int strings = 0, variable_length = 0;
  std::vector<std::string> names;  // "<object>:<attribute>" of every string attribute
};

// Every string attribute of every object in the file (the root group included), read through
// the HDF5 API: how many there are, how many are variable-length.
StringAttributes string_attributes(const std::string& path) {
  StringAttributes found;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  struct Visit {
    StringAttributes* found;
    std::string object;
  } visit{&found, ""};
  const auto on_attribute = [](hid_t object, const char* name, const H5A_info_t*,
                               void* data) -> herr_t {
    auto& v = *static_cast<Visit*>(data);
    const hid_t attr = H5Aopen(object, name, H5P_DEFAULT);
    const hid_t type = H5Aget_type(attr);
    if (H5Tget_class(type) == H5T_STRING) {
      ++v.found->strings;
      v.found->names.push_back(v.object + ":" + name);
      if (H5Tis_variable_str(type) > 0) ++v.found->variable_length;
    } else if (H5Tget_class(type) == H5T_VLEN) {
      ++v.found->variable_length;
    }
    H5Tclose(type);
    H5Aclose(attr);
    return 0;
  };
  const auto attributes_of = [&](const std::string& object_name) {
    visit.object = object_name;
    const hid_t object = H5Oopen(file, object_name.c_str(), H5P_DEFAULT);
    REQUIRE(object >= 0);
    hsize_t at = 0;
    CHECK(H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_NATIVE, &at, on_attribute, &visit) >= 0);
    H5Oclose(object);
  };
  std::vector<std::string> objects = {"/"};
  const auto collect = [](hid_t, const char* name, const H5O_info_t*, void* data) -> herr_t {
    if (std::string(name) != ".") static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  CHECK(H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, collect, &objects) >= 0);
  for (const std::string& object : objects) attributes_of(object);
  H5Fclose(file);
  return found;
}

// Whether the file holds a global heap collection: its signature "GCOL" among the bytes.
bool has_global_heap(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return bytes.find("GCOL") != std::string::npos;
}

// frugal's writer before 2026-12-02: every string attribute as a variable-length UTF-8 string.
// Rewrites the file's string attributes in that form, values unchanged.
void make_strings_variable_length(const std::string& path) {
  const std::vector<std::string> names = string_attributes(path).names;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  for (const std::string& entry : names) {
    const std::string object_name = entry.substr(0, entry.rfind(':'));
    const std::string name = entry.substr(entry.rfind(':') + 1);
    const hid_t object = H5Oopen(file, object_name.c_str(), H5P_DEFAULT);
    REQUIRE(object >= 0);
    const hid_t attr = H5Aopen(object, name.c_str(), H5P_DEFAULT);
    const hid_t fixed = H5Aget_type(attr);
    REQUIRE(H5Tis_variable_str(fixed) == 0);
    std::string value(H5Tget_size(fixed), '\0');
    REQUIRE(H5Aread(attr, fixed, value.data()) >= 0);
    value.erase(value.find_last_not_of('\0') + 1);
    H5Tclose(fixed);
    H5Aclose(attr);
    REQUIRE(H5Adelete(object, name.c_str()) >= 0);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t created = H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(created >= 0);
    const char* text = value.c_str();
    REQUIRE(H5Awrite(created, type, &text) >= 0);
    H5Aclose(created);
    H5Sclose(space);
    H5Tclose(type);
    H5Oclose(object);
  }
  REQUIRE(H5Fclose(file) >= 0);
}

}  // namespace

TEST_CASE("checkpoint format: rank files hold no variable-length strings", "[ckpt]") {
  TempDir tmp;
  Part part;
  CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"part", &part}}, 2);
  part.set(3);
  manager.save(3);
  const std::string path = manager.dir().rank_file(3, 0);
  const StringAttributes found = string_attributes(path);
  // The manifest, its checksum, and each dataset's dtype.
  CHECK(found.strings == 4);
  CHECK(found.variable_length == 0);
  CHECK_FALSE(has_global_heap(path));

  // The writer's own attributes, of every size: the empty string, UTF-8, and one far past the
  // object header's 64 KiB (kept in the dense attribute storage, not the global heap).
  const std::string other = tmp.file("attributes.h5");
  const std::string big(100000, 'x');
  {
    H5Writer writer(other);
    writer.write_tensor("w", Tensor::zeros({2}));
    writer.write_attribute("empty", "");
    writer.write_attribute("unicode", "Grüße, 世界");
    writer.write_attribute("big", big);
    writer.close();
  }
  const StringAttributes other_found = string_attributes(other);
  CHECK(other_found.strings == 4);
  CHECK(other_found.variable_length == 0);
  CHECK_FALSE(has_global_heap(other));
  H5Reader reader(other);
  CHECK(reader.attribute("empty").empty());
  CHECK(reader.attribute("unicode") == "Grüße, 世界");
  CHECK(reader.attribute("big") == big);
}

TEST_CASE("checkpoint format: rank files with variable-length strings (before 2026-12-02) load",
          "[ckpt]") {
  TempDir tmp;
  Part part;
  CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"part", &part}}, 3);
  part.set(2);
  manager.save(2);
  part.set(4);
  manager.save(4);
  for (int64_t step : {2, 4}) {
    const std::string path = manager.dir().rank_file(step, 0);
    make_strings_variable_length(path);
    const StringAttributes found = string_attributes(path);
    CHECK(found.strings == 4);
    CHECK(found.variable_length == 4);
    CHECK(has_global_heap(path));
  }
  // `ckpt verify`'s check, then a resume: the newest step, with its exact values.
  CHECK(check_step(manager.dir(), 4).ok());
  part.set(0);
  CHECK(manager.resume() == 4);
  CHECK(part.holds(4));
  manager.load(2);
  CHECK(part.holds(2));
}

TEST_CASE("checkpoint format: a chunk size past the file's end is refused before HDF5 reads it",
          "[ckpt]") {
  // A rank file the fuzzer damaged (tests/fuzz/regressions/ckpt_rank_file): its chunk index
  // gives optim/table's chunk 3,724,541,972 bytes, which HDF5 1.10 would allocate first.
  const std::string path = std::string(FRUGAL_SOURCE_DIR) +
                           "/tests/fuzz/regressions/ckpt_rank_file/oom-chunk-size-3724541972";
  H5Reader reader(path);
  const std::string what = error_of([&] { reader.read_tensor("optim/table"); });
  CHECK(contains(what, "optim/table"));
  CHECK(contains(what, "stored size says 3724541972 bytes, more than the file's 8081"));
  CHECK(reader.read_tensor("model/weights").numel() == 15);  // the other dataset is intact
}
