// Context parallelism: the whole model trained with ring attention over cp ranks (and
// ZeRO-3 over all dp x cp ranks) equals one rank with ordinary attention on the same global
// batch: cp = 1, 2, 4, and dp = 2 x cp = 2, at a sequence length that is not a multiple of
// 2 cp (padding), with grouped-query attention; and with rotary scaling whose tables depend on
// the whole sequence's length (dynamic) or scale cos and sin (YaRN), which every rank of the
// ring must apply alike.
#include <cmath>
#include <random>

#include "catch_compat.h"
#include "cp_training_support.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model_support.h"
#include "optim/adamw.h"
#include "parallel/mesh.h"
#include "parallel/ring_attention.h"
#include "parallel/zero3_parameters.h"
#include "train/train_step.h"

using namespace frugal;

namespace {

constexpr int64_t kSequences = 4, kSeq = 37;

// Sequences [first, first + count) of the step's global batch.
Batch sequences(int64_t first, int64_t count, int64_t step) {
  return test::slice_of_random_batch(uint32_t(77 + step), kSequences, kSeq, 41, first, count, 9);
}

void check_against_one_rank(int cp, RopeScaling scaling = {}, int64_t sliding_window = 0) {
  test::check_cp_training_against_one_rank(cp, test::cp_test_config(scaling, sliding_window),
                                           kSequences, kSeq, sequences);
}

}  // namespace

TEST_CASE("ring attention training equals one rank", "[cp][mpi]") {
  const int world = mpi_world_size();
  SECTION("cp = every rank") { check_against_one_rank(world); }
  if (world == 4) {
    SECTION("dp = 2 x cp = 2") { check_against_one_rank(2); }
  }
  SECTION("dynamic rotary scaling past the context") {
    RopeScaling dynamic;
    dynamic.type = RopeScalingType::dynamic;
    dynamic.factor = 3;
    check_against_one_rank(world, dynamic);
  }
  SECTION("Mistral's sliding window, shorter than a rank's rows") {
    check_against_one_rank(world, {}, 6);
  }
  SECTION("YaRN") {
    RopeScaling yarn;
    yarn.type = RopeScalingType::yarn;
    yarn.factor = 4;
    yarn.original_max_position_embeddings = 16;
    check_against_one_rank(world, yarn);
  }
}
