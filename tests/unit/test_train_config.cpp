// Training configuration values that need parsing or cross-checks: memory sizes with units
// (parallel.gpu_mem_limit) and the device choice.
#include "catch_compat.h"
#include "core/log.h"
#include "test_support.h"
#include "train/train_config.h"

using namespace frugal;

TEST_CASE("sizes with units parse to bytes", "[config]") {
  CHECK(parse_bytes("0", "k") == 0);
  CHECK(parse_bytes("1000000", "k") == 1000000);
  CHECK(parse_bytes("24GiB", "k") == size_t(24) << 30);
  CHECK(parse_bytes("24 gib", "k") == size_t(24) << 30);
  CHECK(parse_bytes("1.5GiB", "k") == size_t(3) << 29);
  CHECK(parse_bytes("512MiB", "k") == size_t(512) << 20);
  CHECK(parse_bytes("3KiB", "k") == 3072);
  CHECK(parse_bytes("2TiB", "k") == size_t(2) << 40);
  CHECK(parse_bytes("24GB", "k") == size_t(24000000000));
  CHECK(parse_bytes("7 MB", "k") == size_t(7000000));
  CHECK(parse_bytes("64B", "k") == 64);
}

TEST_CASE("a bad size names the key and the text", "[config]") {
  for (const char* text : {"lots", "24 GiBs", "-1GiB", "", "GiB", "1e30"}) {
    const std::string message = test::error_of([&] { parse_bytes(text, "parallel.gpu_mem_limit"); });
    INFO(text << " -> " << message);
    CHECK(test::contains(message, "parallel.gpu_mem_limit"));
    CHECK(test::contains(message, "is not a size"));
  }
}

TEST_CASE("parallel.device must be auto, cpu or cuda", "[config]") {
  TrainConfig c;
  CHECK(test::error_of([&] { c.validate(); }).empty());
  c.parallel.device = "gpu";
  CHECK(test::contains(test::error_of([&] { c.validate(); }), "'parallel.device': value 'gpu'"));
  c.parallel.device = "cuda";
  c.parallel.gpu_mem_limit = "24 pages";
  CHECK(test::contains(test::error_of([&] { c.validate(); }), "parallel.gpu_mem_limit"));
}

TEST_CASE("optim.state_dtype is fp32 or bf16, and bf16 asks for GPUs without offload", "[config]") {
  TrainConfig c;
  c.optim.state_dtype = "fp16";
  CHECK(test::contains(test::error_of([&] { c.validate(); }), "'optim.state_dtype': value 'fp16'"));
  c.optim.state_dtype = "bf16";
  c.parallel.device = "cpu";
  CHECK(test::contains(test::error_of([&] { c.validate(); }), "bf16 needs parallel.device = cuda"));
  c.parallel.device = "cuda";
  CHECK(test::error_of([&] { c.validate(); }).empty());
  c.parallel.offload = "optimizer";
  CHECK(test::contains(test::error_of([&] { c.validate(); }), "bf16 works without offload"));
}
