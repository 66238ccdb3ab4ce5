// Packed documents in ring attention: the gathered bounds of every chunk, the block pairs that
// share a document, and the cache that gathers them once per micro-batch.
#include "parallel/ring_documents.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace frugal {

void check_document_partition(const int32_t* start, const int32_t* end, int64_t len,
                              const std::string& what) {
  for (int64_t p = 0; p < len; ++p) {
    const int64_t s = start[p], e = end[p];
    if (s > p || p >= e || e > len)
      fail(what, ": position ", p, " lies outside its document [", s, ", ", e,
           ") or the document outside [0, ", len, ")");
    if (p == s) {
      if (p > 0 && end[p - 1] != p)
        fail(what, ": a document begins at position ", p, " but the one before it ends at ",
             end[p - 1]);
    } else if (start[p - 1] != s || end[p - 1] != e) {
      fail(what, ": positions ", p - 1, " and ", p, " are in one document [", s, ", ", e,
           ") by the second's bounds, but the first's are [", start[p - 1], ", ", end[p - 1], ")");
    }
  }
}

RingDocuments::RingDocuments(const ops::DocumentBounds& local, int64_t batch, int64_t chunk_len,
                             Comm& cp)
    : local_(local), batch_(batch), chunk_len_(chunk_len), cp_(&cp) {
  const int64_t rows = batch * 2 * chunk_len;
  FRUGAL_CHECK(batch > 0 && chunk_len > 0, "ring documents of ", batch, " sequences of chunks of ",
               chunk_len);
  for (const Tensor* t : {&local.start, &local.end})
    FRUGAL_CHECK(t->defined() && t->dtype() == DType::i32 && t->ndim() == 1 && t->size(0) == rows &&
                     t->device() == local.start.device(),
                 "ring attention: document bounds must be i32 [", rows,
                 "] (this rank's rows) on one device, not ",
                 t->defined() ? shape_string(t->shape()) : "undefined");

  // One message a rank: its starts, then its ends.
  Tensor mine = ops::empty_like(local.start, {2 * rows}, DType::i32);
  Tensor mine_start = mine.rows(0, rows), mine_end = mine.rows(rows, 2 * rows);
  ops::copy(mine_start, local.start);
  ops::copy(mine_end, local.end);
  Tensor all = ops::empty_like(local.start, {cp.size() * 2 * rows}, DType::i32);
  cp.all_gather(mine, all)->wait_host();
  // A copy into pageable host memory returns complete (CUDA's rule), so the host reads the
  // gathered bounds right after it.
  Tensor host = Tensor::empty(all.shape(), DType::i32);
  ops::copy(host, all);

  // Chunk-major: chunk x's rows of every sequence together, as a block pair takes them.
  const int64_t chunks = 2 * int64_t(cp.size()), per_chunk = batch * chunk_len;
  Tensor starts = Tensor::empty({chunks * per_chunk}, DType::i32);
  Tensor ends = Tensor::empty({chunks * per_chunk}, DType::i32);
  const int32_t* gathered = host.data<int32_t>();
  int32_t* s = starts.data<int32_t>();
  int32_t* e = ends.data<int32_t>();
  for (int r = 0; r < cp.size(); ++r) {
    const int32_t* from = gathered + int64_t(r) * 2 * rows;
    for (int half = 0; half < 2; ++half) {
      const int64_t chunk = half == 0 ? r : chunks - 1 - r;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < chunk_len; ++i) {
          const int64_t src = (b * 2 + half) * chunk_len + i;
          const int64_t dst = chunk * per_chunk + b * chunk_len + i;
          s[dst] = from[src];
          e[dst] = from[rows + src];
        }
    }
  }

  // Each sequence's documents must tile its padded length: the schedule and the kernels'
  // masks trust that the bounds are non-decreasing and agree with each other.
  const int64_t padded = chunks * chunk_len;
  std::vector<int32_t> seq_start(static_cast<size_t>(padded)), seq_end(static_cast<size_t>(padded));
  lowest_start_.assign(size_t(chunks), std::numeric_limits<int64_t>::max());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t x = 0; x < chunks; ++x)
      for (int64_t i = 0; i < chunk_len; ++i) {
        const int64_t at = x * per_chunk + b * chunk_len + i;
        seq_start[size_t(x * chunk_len + i)] = s[at];
        seq_end[size_t(x * chunk_len + i)] = e[at];
        lowest_start_[size_t(x)] = std::min<int64_t>(lowest_start_[size_t(x)], s[at]);
      }
    check_document_partition(seq_start.data(), seq_end.data(), padded,
                             "ring attention: the documents of sequence " + std::to_string(b) +
                                 " of the micro-batch (padded to " + std::to_string(padded) +
                                 " positions)");
  }
  starts_ = ops::on_device_of(starts, local.start);
  ends_ = ops::on_device_of(ends, local.start);
}

bool RingDocuments::gathered_from(const ops::DocumentBounds& local, int64_t batch,
                                  int64_t chunk_len, const Comm& cp) const {
  return local.defined() && local.end.defined() && local.start.raw() == local_.start.raw() &&
         local.end.raw() == local_.end.raw() && local.start.shape() == local_.start.shape() &&
         local.end.shape() == local_.end.shape() && batch == batch_ && chunk_len == chunk_len_ &&
         &cp == cp_;
}

bool RingDocuments::sees(int64_t query_chunk, int64_t key_chunk, int64_t window) const {
  if (key_chunk > query_chunk) return false;  // after every query: causal
  if (key_chunk == query_chunk) return true;  // every row sees itself
  // The rows' lowest visible key is non-decreasing along a chunk (starts are, and so is
  // p - window + 1), so the chunk's first row of the sequence with the lowest start sees the
  // lowest key of all: the pair shares a document iff that key is in the key chunk or before.
  int64_t lowest = lowest_start_[size_t(query_chunk)];
  if (window > 0) lowest = std::max(lowest, query_chunk * chunk_len_ - window + 1);
  return lowest < (key_chunk + 1) * chunk_len_;
}

ops::BlockDocuments RingDocuments::block(int64_t query_chunk, int64_t key_chunk) const {
  const int64_t per_chunk = batch_ * chunk_len_;
  ops::BlockDocuments d;
  d.query_doc_start = starts_.rows(query_chunk * per_chunk, (query_chunk + 1) * per_chunk);
  d.key_doc_end = ends_.rows(key_chunk * per_chunk, (key_chunk + 1) * per_chunk);
  d.key_position0 = key_chunk * chunk_len_;
  return d;
}

const RingDocuments& RingDocumentCache::get(const ops::DocumentBounds& local, int64_t batch,
                                            int64_t chunk_len, Comm& cp) {
  if (!cached_ || !cached_->gathered_from(local, batch, chunk_len, cp)) {
    cached_.reset();  // the last micro-batch's bounds go first
    cached_ = std::make_unique<RingDocuments>(local, batch, chunk_len, cp);
  }
  return *cached_;
}

}  // namespace frugal
