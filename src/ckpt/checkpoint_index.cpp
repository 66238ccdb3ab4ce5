// index.h5: HDF5 virtual datasets over the rank files' row shards.
#include "ckpt/checkpoint_index.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "ckpt/checkpoint_dir.h"
#include "core/error.h"
#include "core/regular_file.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

// Closes an HDF5 identifier at the end of its scope.
struct Id {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Id() {
    if (id >= 0) close(id);
  }
  operator hid_t() const { return id; }
};

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.h5", rank);
  return buf;
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_checkpoint_index(const std::string& step_dir, int world_size,
                            const std::vector<IndexEntry>& entries) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string path = (fs::path(step_dir) / "index.h5").string();
  const std::string tmp = path + ".tmp";
  {
    Id file{H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    if (file < 0) fail("cannot create checkpoint index '", tmp, "'");
    Id lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
    H5Pset_create_intermediate_group(lcpl, 1);
    for (const IndexEntry& e : entries) {
      // Row-major [rows, ...]: a scalar is one row of one element, as the rank files keep it.
      const hsize_t rows = e.full_shape.empty() ? 1 : hsize_t(e.full_shape[0]);
      std::vector<hsize_t> dims = {rows};
      for (size_t d = 1; d < e.full_shape.size(); ++d) dims.push_back(hsize_t(e.full_shape[d]));
      const int ndims = int(dims.size());
      Id space{H5Screate_simple(ndims, dims.data(), nullptr), H5Sclose};
      Id dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
      const int sources = e.replicated ? 1 : world_size;
      const hsize_t shard_rows = e.replicated ? rows : (rows + world_size - 1) / world_size;
      for (int rank = 0; rank < sources; ++rank) {
        const hsize_t first = std::min<hsize_t>(rows, rank * shard_rows);
        const hsize_t last = std::min<hsize_t>(rows, first + shard_rows);
        if (last == first) continue;  // this rank's rows are all padding
        std::vector<hsize_t> start(dims.size(), 0), count = dims;
        start[0] = first;
        count[0] = last - first;
        Id target{H5Screate_simple(ndims, dims.data(), nullptr), H5Sclose};
        H5Sselect_hyperslab(target, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
        std::vector<hsize_t> source_dims = dims, source_start(dims.size(), 0);
        source_dims[0] = shard_rows;
        Id source{H5Screate_simple(ndims, source_dims.data(), nullptr), H5Sclose};
        H5Sselect_hyperslab(source, H5S_SELECT_SET, source_start.data(), nullptr, count.data(),
                            nullptr);
        // A relative name: HDF5 looks for it beside index.h5, wherever the directory moves.
        if (H5Pset_virtual(dcpl, target, rank_file_name(rank).c_str(), e.name.c_str(), source) < 0)
          fail("checkpoint index '", tmp, "': cannot map '", e.name, "' of rank ", rank);
      }
      Id dataset{H5Dcreate2(file, e.name.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT),
                 H5Dclose};
      if (dataset < 0) fail("checkpoint index '", tmp, "': cannot create '", e.name, "'");
    }
    if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) fail("cannot write checkpoint index '", tmp, "'");
  }
  fsync_file(tmp);
  move_directory_aside(path);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

std::vector<std::string> checkpoint_index_sources(const std::string& index_path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  // HDF5 opens the file itself, with a plain open(), which a FIFO would block forever.
  require_regular_file(index_path, "checkpoint index");
  Id file{H5Fopen(index_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (file < 0) fail("checkpoint index '", index_path, "': damaged: HDF5 cannot open it");
  std::vector<std::string> sources;
  struct Visit {
    std::vector<std::string>* sources;
    bool failed = false;
  } visit{&sources};
  const auto on_object = [](hid_t root, const char* name, const H5O_info_t* info,
                            void* data) -> herr_t {
    auto& v = *static_cast<Visit*>(data);
    if (info->type != H5O_TYPE_DATASET) return 0;
    Id dataset{H5Dopen2(root, name, H5P_DEFAULT), H5Dclose};
    Id dcpl{dataset < 0 ? -1 : H5Dget_create_plist(dataset), H5Pclose};
    size_t count = 0;
    if (dcpl < 0 || H5Pget_virtual_count(dcpl, &count) < 0) {
      v.failed = true;
      return -1;
    }
    for (size_t i = 0; i < count; ++i) {
      const ssize_t length = H5Pget_virtual_filename(dcpl, i, nullptr, 0);
      if (length < 0) {
        v.failed = true;  // a mapping whose file cannot be told: damaged
        return -1;
      }
      std::string file(size_t(length) + 1, '\0');
      H5Pget_virtual_filename(dcpl, i, file.data(), file.size());
      file.resize(size_t(length));
      if (std::find(v.sources->begin(), v.sources->end(), file) == v.sources->end())
        v.sources->push_back(file);
    }
    return 0;
  };
  if (H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, on_object, &visit) < 0 || visit.failed)
    fail("checkpoint index '", index_path, "': damaged: HDF5 cannot list its virtual datasets");
  std::sort(sources.begin(), sources.end());
  return sources;
}

}  // namespace frugal
