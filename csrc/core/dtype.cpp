#include "core/dtype.h"

#include <array>

namespace vllmx {

namespace {
constexpr std::array<TypeTraits, kMaxDType> make_table() {
  std::array<TypeTraits, kMaxDType> t{};
  for (auto& e : t) e = {"unknown", 1, 0, false, false};
  auto set = [&](DType d, const char* n, int64_t bs, int64_t ts, bool q, bool s) {
    t[static_cast<int>(d)] = {n, bs, ts, q, s};
  };
  set(DType::F32, "F32", 1, 4, false, true);
  set(DType::F16, "F16", 1, 2, false, true);
  set(DType::BF16, "BF16", 1, 2, false, true);
  set(DType::Q4_0, "Q4_0", 32, 18, true, true);
  set(DType::Q4_1, "Q4_1", 32, 20, true, true);
  set(DType::Q5_0, "Q5_0", 32, 22, true, true);
  set(DType::Q5_1, "Q5_1", 32, 24, true, true);
  set(DType::Q8_0, "Q8_0", 32, 34, true, true);
  set(DType::Q8_1, "Q8_1", 32, 36, true, false);
  set(DType::Q2_K, "Q2_K", 256, 84, true, true);
  set(DType::Q3_K, "Q3_K", 256, 110, true, true);
  set(DType::Q4_K, "Q4_K", 256, 144, true, true);
  set(DType::Q5_K, "Q5_K", 256, 176, true, true);
  set(DType::Q6_K, "Q6_K", 256, 210, true, true);
  set(DType::Q8_K, "Q8_K", 256, 292, true, false);
  set(DType::IQ4_NL, "IQ4_NL", 32, 18, true, true);
  set(DType::IQ4_XS, "IQ4_XS", 256, 136, true, true);
  set(DType::TQ1_0, "TQ1_0", 256, 54, true, true);
  set(DType::TQ2_0, "TQ2_0", 256, 66, true, true);
  set(DType::MXFP4, "MXFP4", 32, 17, true, true);
  set(DType::IQ2_XXS, "IQ2_XXS", 256, 66, true, true);
  set(DType::IQ2_XS, "IQ2_XS", 256, 74, true, true);
  set(DType::IQ3_XXS, "IQ3_XXS", 256, 98, true, true);
  set(DType::IQ1_S, "IQ1_S", 256, 50, true, true);
  set(DType::IQ3_S, "IQ3_S", 256, 110, true, true);
  set(DType::IQ2_S, "IQ2_S", 256, 82, true, true);
  set(DType::IQ1_M, "IQ1_M", 256, 56, true, true);
  set(DType::I8, "I8", 1, 1, false, false);
  set(DType::I16, "I16", 1, 2, false, false);
  set(DType::I32, "I32", 1, 4, false, true);
  set(DType::I64, "I64", 1, 8, false, true);
  set(DType::F64, "F64", 1, 8, false, false);
  // Same bytes per row as the block types they repack (repack.h).
  set(DType::Q4_0_X16, "Q4_0_X16", 32, 18, true, true);
  set(DType::Q4_1_X16, "Q4_1_X16", 32, 20, true, true);
  set(DType::Q5_0_X16, "Q5_0_X16", 32, 22, true, true);
  set(DType::Q5_1_X16, "Q5_1_X16", 32, 24, true, true);
  set(DType::Q8_0_X16, "Q8_0_X16", 32, 34, true, true);
  set(DType::Q4_K_X16, "Q4_K_X16", 256, 144, true, true);
  set(DType::Q5_K_X16, "Q5_K_X16", 256, 176, true, true);
  set(DType::Q6_K_X16, "Q6_K_X16", 256, 210, true, true);
  set(DType::F32_X16, "F32_X16", 1, 4, false, true);
  set(DType::F16_X16, "F16_X16", 1, 2, false, true);
  set(DType::BF16_X16, "BF16_X16", 1, 2, false, true);
  set(DType::F8_E4M3, "F8_E4M3", 1, 1, false, true);
  set(DType::F8_E4M3_B128, "F8_E4M3_B128", 128, 132, true, true);
  set(DType::U8, "U8", 1, 1, false, true);
  set(DType::U64, "U64", 1, 8, false, true);
  return t;
}
constexpr std::array<TypeTraits, kMaxDType> kTypeTraits = make_table();
const TypeTraits kUnknown = {"unknown", 1, 0, false, false};
}  // namespace

const TypeTraits& type_traits(DType t) {
  int i = static_cast<int>(t);
  return (i >= 0 && i < kMaxDType) ? kTypeTraits[i] : kUnknown;
}

}  // namespace vllmx
