// The MLP half of a block, whole or a chunk of rows at a time; see llama_mlp.h.
#include "model/llama_mlp.h"

#include <algorithm>

#include "model/block_projection.h"

namespace frugal {

namespace {

constexpr int kMlpProjections[] = {kGateProj, kUpProj, kDownProj};

float eps_of(const BlockContext& ctx) { return static_cast<float>(ctx.config->rms_norm_eps); }

double sum_of_squares(const Tensor& t) { return ops::sum_squares({t}); }

// As a kernel that is not deterministic would: the recompute differs from the forward.
void perturb(Tensor& act, const BlockContext& ctx) {
  if (ctx.perturb_recompute) ops::scale_inplace(act, 1.0f + 1.0f / 64);
}

// dst's rows [begin, begin + src rows) = src.
void put_rows(Tensor& dst, int64_t begin, const Tensor& src) {
  Tensor rows = dst.rows(begin, begin + src.size(0));
  ops::copy(rows, src);
}

// The chunk [begin, end) of ctx's rows: its adapters draw their dropout for those rows.
BlockContext chunk_context(const BlockContext& ctx, int64_t begin) {
  BlockContext c = ctx;
  c.first_row = ctx.first_row + begin;
  return c;
}

}  // namespace

int64_t mlp_chunk_rows(int64_t tokens, const LlamaConfig& config, int64_t setting) {
  if (setting > 0) return std::min(setting, std::max<int64_t>(1, tokens));
  if (tokens <= kMlpWholeTokens) return tokens;
  const int64_t half_of_hidden =
      (tokens * config.hidden_size / 2 + config.intermediate_size - 1) / config.intermediate_size;
  const int64_t rows = std::max(kMlpMinChunkTokens, (half_of_hidden + 1023) / 1024 * 1024);
  return std::min(rows, tokens);
}

bool mlp_in_chunks(const BlockContext& ctx, int64_t tokens) {
  if (ctx.mlp_chunk_rows <= 0 || ctx.mlp_chunk_rows >= tokens) return false;
  if (ctx.fp8)
    for (int p : kMlpProjections)
      if (ctx.fp8->covers(p)) return false;
  return true;
}

Tensor mlp_forward(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx,
                   Fp8InputCasts& casts, MlpKept kept, double* checksum) {
  const int64_t tokens = a.h.size(0);
  if (!mlp_in_chunks(ctx, tokens)) {
    a.n2 = ops::rmsnorm(a.h, w.post_attention_norm, eps_of(ctx), &a.rstd2);
    a.gate = project(a.n2, w, kGateProj, ctx, a, casts);
    a.up = project(a.n2, w, kUpProj, ctx, a, casts);
    a.act = ops::swiglu(a.gate, a.up);
    if (checksum) *checksum = sum_of_squares(a.act);
    return project(a.act, w, kDownProj, ctx, a, casts, /*residual=*/a.h);
  }
  // The whole tensors the policy keeps, filled a chunk at a time.
  const int64_t ffn = ctx.config->intermediate_size;
  const bool keep_projections = kept != MlpKept::nothing;
  const bool keep_all = kept == MlpKept::everything;
  if (keep_projections) {
    a.gate = ops::empty_like(a.h, {tokens, ffn}, a.h.dtype());
    a.up = ops::empty_like(a.h, {tokens, ffn}, a.h.dtype());
    for (int p : kMlpProjections)
      if (w.lora_a[p].defined())
        a.lora_t[p] = ops::empty_like(a.h, {tokens, w.lora_a[p].size(0)}, a.h.dtype());
  }
  if (keep_all) {
    a.n2 = ops::empty_like(a.h, a.h.shape(), a.h.dtype());
    a.rstd2 = ops::empty_like(a.h, {tokens}, DType::f32);
    a.act = ops::empty_like(a.h, {tokens, ffn}, a.h.dtype());
  }
  if (checksum) *checksum = 0;
  Tensor y = ops::empty_like(a.h, a.h.shape(), a.h.dtype());
  for (int64_t begin = 0; begin < tokens; begin += ctx.mlp_chunk_rows) {
    const int64_t end = std::min(tokens, begin + ctx.mlp_chunk_rows);
    const BlockContext cctx = chunk_context(ctx, begin);
    const Tensor h = a.h.rows(begin, end);
    BlockActivations c;
    Fp8InputCasts chunk_casts;  // unused: no FP8 linear in a chunked MLP
    c.n2 = ops::rmsnorm(h, w.post_attention_norm, eps_of(ctx), &c.rstd2);
    c.gate = project(c.n2, w, kGateProj, cctx, c, chunk_casts);
    c.up = project(c.n2, w, kUpProj, cctx, c, chunk_casts);
    c.act = ops::swiglu(c.gate, c.up);
    if (checksum) *checksum += sum_of_squares(c.act);
    put_rows(y, begin, project(c.act, w, kDownProj, cctx, c, chunk_casts, /*residual=*/h));
    if (keep_projections) {
      put_rows(a.gate, begin, c.gate);
      put_rows(a.up, begin, c.up);
      for (int p : kMlpProjections)
        if (c.lora_t[p].defined()) put_rows(a.lora_t[p], begin, c.lora_t[p]);
    }
    if (keep_all) {
      put_rows(a.n2, begin, c.n2);
      put_rows(a.rstd2, begin, c.rstd2);
      put_rows(a.act, begin, c.act);
    }
  }
  return y;
}

namespace {

// The MLP's backward on whole tensors or one chunk's: c holds n2, rstd2, gate, up, act and the
// adapters' t of the same rows as dy and h.
Tensor backward_rows(const Tensor& dy, const Tensor& h, const BlockActivations& c,
                     const BlockWeights& w, BlockWeights& g, const BlockContext& ctx,
                     Fp8InputCasts& casts) {
  Tensor d_act = project_backward(dy, c.act, w, g, kDownProj, ctx, c, casts);
  ops::SwigluGrads d_mlp = ops::swiglu_backward(d_act, c.gate, c.up);
  Tensor d_n2 = project_backward(d_mlp.dg, c.n2, w, g, kGateProj, ctx, c, casts);
  project_backward(d_mlp.du, c.n2, w, g, kUpProj, ctx, c, casts, &d_n2);
  return ops::rmsnorm_backward(d_n2, h, w.post_attention_norm, c.rstd2, g.post_attention_norm,
                               /*dresidual=*/dy, g.write);
}

}  // namespace

Tensor mlp_backward(const Tensor& dy, const BlockActivations& a, const BlockWeights& w,
                    BlockWeights& g, const BlockContext& ctx, Fp8InputCasts& casts,
                    double* checksum) {
  const int64_t tokens = a.h.size(0);
  if (!mlp_in_chunks(ctx, tokens)) return backward_rows(dy, a.h, a, w, g, ctx, casts);
  if (checksum) *checksum = 0;
  Tensor dh = ops::empty_like(dy, dy.shape(), dy.dtype());
  for (int64_t begin = 0; begin < tokens; begin += ctx.mlp_chunk_rows) {
    const int64_t end = std::min(tokens, begin + ctx.mlp_chunk_rows);
    const BlockContext cctx = chunk_context(ctx, begin);
    const Tensor h = a.h.rows(begin, end);
    // This chunk's intermediates: the kept rows, or made again from h.
    BlockActivations c;
    Fp8InputCasts chunk_casts;  // unused: no FP8 linear in a chunked MLP
    for (int p : kMlpProjections)
      if (a.lora_t[p].defined()) c.lora_t[p] = a.lora_t[p].rows(begin, end);
    if (a.n2.defined()) {
      c.n2 = a.n2.rows(begin, end);
      c.rstd2 = a.rstd2.rows(begin, end);
    } else {
      c.n2 = ops::rmsnorm(h, w.post_attention_norm, eps_of(ctx), &c.rstd2);
    }
    if (a.gate.defined()) {
      c.gate = a.gate.rows(begin, end);
      c.up = a.up.rows(begin, end);
    } else {
      c.gate = project(c.n2, w, kGateProj, cctx, c, chunk_casts);
      c.up = project(c.n2, w, kUpProj, cctx, c, chunk_casts);
    }
    if (a.act.defined()) {
      c.act = a.act.rows(begin, end);
    } else {
      c.act = ops::swiglu(c.gate, c.up);
      perturb(c.act, ctx);
      if (checksum) *checksum += sum_of_squares(c.act);
      if (w.lora_a[kDownProj].defined() && !c.lora_t[kDownProj].defined())
        c.lora_t[kDownProj] = adapter_t(c.act, w, kDownProj, cctx);
    }
    put_rows(dh, begin, backward_rows(dy.rows(begin, end), h, c, w, g, cctx, chunk_casts));
  }
  return dh;
}

}  // namespace frugal
