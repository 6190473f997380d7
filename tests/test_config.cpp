#include <gtest/gtest.h>

#include <cmath>

#include "mla/config.hpp"
#include "mla/error.hpp"

TEST(Config, PresetsHaveTheSpecDimensions) {
  const auto k3 = mla::LayerConfig::preset("kimi-k3");
  EXPECT_EQ(k3.heads(), 12);
  EXPECT_EQ(k3.row_dim(), 576);
  EXPECT_EQ(k3.rope, mla::RopeType::none);
  EXPECT_EQ(k3.gate, mla::GateLayout::merged);
  EXPECT_EQ(k3.qkv_a_rows(), 1536 + 512 + 64 + 12 * 128);
  const auto ds = mla::LayerConfig::preset("deepseek-v3");
  EXPECT_EQ(ds.heads(), 16);
  EXPECT_EQ(ds.gate, mla::GateLayout::none);
  EXPECT_EQ(ds.rope, mla::RopeType::yarn);
  EXPECT_EQ(mla::LayerConfig::preset("kimi-k2").heads(), 8);
}

TEST(Config, SoftmaxScaleIncludesYarnMscaleSquared) {
  EXPECT_DOUBLE_EQ(mla::LayerConfig::preset("kimi-k3").sm_scale(), 1.0 / std::sqrt(192.0));
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(mla::LayerConfig::preset("deepseek-v3").sm_scale(), m * m / std::sqrt(192.0), 1e-15);
}

TEST(Config, RejectsInconsistentFieldsByName) {
  auto c = mla::LayerConfig::preset("kimi-k3");
  c.tp_size = 7;
  try {
    c.validate();
    FAIL() << "expected mla::Error";
  } catch (const mla::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tp_size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mla::LayerConfig::preset("llama"), mla::Error);
}
