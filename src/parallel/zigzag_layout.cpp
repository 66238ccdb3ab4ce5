// The zigzag layout's index arithmetic, its scatter and gather, and a micro-batch's share of it.
#include "parallel/zigzag_layout.h"

#include <cstring>
#include <string>

#include "core/error.h"
#include "ops/ops.h"
#include "parallel/ring_documents.h"

namespace frugal {

namespace {

int64_t row_bytes(const Tensor& t) {
  FRUGAL_CHECK(t.ndim() >= 1 && t.size(0) > 0, "zigzag rows of a tensor of shape ",
               shape_string(t.shape()));
  return int64_t(t.bytes()) / t.size(0);
}

}  // namespace

ZigzagLayout zigzag_layout(int64_t seq_len, int cp_size, int cp_rank) {
  if (seq_len < 1 || cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size)
    fail("zigzag layout of ", seq_len, " tokens over ", cp_size, " ranks (rank ", cp_rank,
         "): need at least one token and a rank in [0, ranks)");
  ZigzagLayout l;
  l.seq_len = seq_len;
  l.cp_size = cp_size;
  l.cp_rank = cp_rank;
  const int64_t chunks = 2 * int64_t(cp_size);
  l.chunk_len = (seq_len + chunks - 1) / chunks;
  l.padded_len = l.chunk_len * chunks;
  return l;
}

std::vector<int64_t> zigzag_token_indices(const ZigzagLayout& layout) {
  std::vector<int64_t> indices;
  indices.reserve(size_t(layout.local_len()));
  for (int half = 0; half < 2; ++half)
    for (int64_t i = 0; i < layout.chunk_len; ++i)
      indices.push_back(layout.chunk(half) * layout.chunk_len + i);
  return indices;
}

Tensor zigzag_positions(const ZigzagLayout& layout, int64_t batch) {
  const std::vector<int64_t> indices = zigzag_token_indices(layout);
  Tensor positions = Tensor::empty({batch * layout.local_len()}, DType::i32);
  int32_t* p = positions.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b)
    for (size_t i = 0; i < indices.size(); ++i)
      p[b * layout.local_len() + int64_t(i)] = int32_t(indices[i]);
  return positions;
}

Tensor zigzag_scatter(const Tensor& full, const ZigzagLayout& layout, int64_t batch) {
  FRUGAL_CHECK(batch > 0 && full.ndim() >= 1 && full.size(0) == batch * layout.seq_len,
               "zigzag_scatter of ", shape_string(full.shape()), " as ", batch, " sequences of ",
               layout.seq_len);
  FRUGAL_CHECK(full.device() == Device::cpu, "zigzag_scatter takes a host tensor");
  Shape shape = full.shape();
  shape[0] = batch * layout.local_len();
  Tensor local = Tensor::empty(shape, full.dtype());
  const size_t rb = size_t(row_bytes(full));
  const std::vector<int64_t> indices = zigzag_token_indices(layout);
  const char* src = static_cast<const char*>(full.raw());
  char* dst = static_cast<char*>(local.raw());
  for (int64_t b = 0; b < batch; ++b) {
    for (size_t i = 0; i < indices.size(); ++i) {
      char* row = dst + size_t(b * layout.local_len() + int64_t(i)) * rb;
      if (indices[i] < layout.seq_len)
        std::memcpy(row, src + size_t(b * layout.seq_len + indices[i]) * rb, rb);
      else
        std::memset(row, 0, rb);
    }
  }
  return local;
}

void zigzag_place(Tensor& full, const Tensor& local, const ZigzagLayout& layout, int64_t batch) {
  FRUGAL_CHECK(batch > 0 && full.ndim() >= 1 && full.size(0) == batch * layout.seq_len &&
                   local.ndim() == full.ndim() && local.size(0) == batch * layout.local_len() &&
                   local.dtype() == full.dtype() && row_bytes(local) == row_bytes(full),
               "zigzag_place of ", shape_string(local.shape()), " into ",
               shape_string(full.shape()), " as ", batch, " sequences of ", layout.seq_len);
  const size_t rb = size_t(row_bytes(full));
  const std::vector<int64_t> indices = zigzag_token_indices(layout);
  const char* src = static_cast<const char*>(local.raw());
  char* dst = static_cast<char*>(full.raw());
  for (int64_t b = 0; b < batch; ++b)
    for (size_t i = 0; i < indices.size(); ++i)
      if (indices[i] < layout.seq_len)
        std::memcpy(dst + size_t(b * layout.seq_len + indices[i]) * rb,
                    src + size_t(b * layout.local_len() + int64_t(i)) * rb, rb);
}

Tensor zigzag_gather(const Tensor& local, const ZigzagLayout& layout, int64_t batch, Comm& cp) {
  FRUGAL_CHECK(cp.size() == layout.cp_size && cp.rank() == layout.cp_rank,
               "zigzag_gather: layout of rank ", layout.cp_rank, " of ", layout.cp_size,
               " on rank ", cp.rank(), " of ", cp.size());
  Shape all_shape = local.shape();
  all_shape[0] *= cp.size();
  Tensor all = Tensor::empty(all_shape, local.dtype());
  cp.all_gather(local, all)->wait();
  Shape full_shape = local.shape();
  full_shape[0] = batch * layout.seq_len;
  Tensor full = Tensor::empty(full_shape, local.dtype());
  const int64_t rows = local.size(0);
  for (int r = 0; r < cp.size(); ++r)
    zigzag_place(full, all.rows(r * rows, (r + 1) * rows),
                 zigzag_layout(layout.seq_len, layout.cp_size, r), batch);
  return full;
}

Batch context_parallel_slice(const Batch& whole, const ZigzagLayout& layout) {
  FRUGAL_CHECK(whole.seq == layout.seq_len, "a batch of sequences of ", whole.seq,
               " tokens cut by a layout of ", layout.seq_len);
  Batch local;
  local.batch = whole.batch;
  local.seq = layout.local_len();
  local.full_seq = whole.full_seq > 0 ? whole.full_seq : whole.seq;
  local.tokens = zigzag_scatter(whole.tokens, layout, whole.batch);
  local.targets = zigzag_scatter(whole.targets, layout, whole.batch);
  const std::vector<int64_t> index = zigzag_token_indices(layout);
  int32_t* targets = local.targets.data<int32_t>();
  for (int64_t b = 0; b < whole.batch; ++b)
    for (int64_t i = 0; i < local.seq; ++i)
      if (index[size_t(i)] >= layout.seq_len) targets[b * local.seq + i] = -1;
  if (!whole.documents.defined()) {
    local.positions = zigzag_positions(layout, whole.batch);
    return local;
  }

  // Packed documents: each row keeps its own position and bounds; each padding row, at the end
  // of its sequence, is a document of one token. No real token sees it, and it sees no other
  // chunk: one document [seq_len, padded_len) would make the ring move and compute the padding
  // chunks among themselves when the padding spans several (short sequences over many ranks).
  const int64_t rows = whole.batch * whole.seq;
  for (const Tensor* t : {&whole.positions, &whole.documents.start, &whole.documents.end})
    FRUGAL_CHECK(t->defined() && t->dtype() == DType::i32 && t->ndim() == 1 && t->size(0) == rows &&
                     t->device() == Device::cpu,
                 "context parallelism with packed documents takes host i32 [", rows,
                 "] positions and document bounds, not ",
                 t->defined() ? shape_string(t->shape()) : "undefined");
  for (int64_t b = 0; b < whole.batch; ++b)
    check_document_partition(
        whole.documents.start.data<int32_t>() + b * whole.seq,
        whole.documents.end.data<int32_t>() + b * whole.seq, whole.seq,
        "the packed documents of sequence " + std::to_string(b) + " of the micro-batch");
  local.positions = zigzag_scatter(whole.positions, layout, whole.batch);
  local.documents.start = zigzag_scatter(whole.documents.start, layout, whole.batch);
  local.documents.end = zigzag_scatter(whole.documents.end, layout, whole.batch);
  int32_t* positions = local.positions.data<int32_t>();
  int32_t* start = local.documents.start.data<int32_t>();
  int32_t* end = local.documents.end.data<int32_t>();
  for (int64_t b = 0; b < whole.batch; ++b)
    for (int64_t i = 0; i < local.seq; ++i)
      if (index[size_t(i)] >= layout.seq_len) {
        const int64_t row = b * local.seq + i;
        positions[row] = int32_t(index[size_t(i)]);
        start[row] = int32_t(index[size_t(i)]);
        end[row] = int32_t(index[size_t(i)] + 1);
      }
  return local;
}

}  // namespace frugal
