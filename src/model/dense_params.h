// Every unit held whole in one dtype, with whole gradients: the ParamProvider for
// single-process use without an optimizer (scoring, gradient checks, export).
#pragma once
#include <vector>

#include "backend/backend.h"
#include "model/layout.h"
#include "model/param_provider.h"

namespace st {

class DenseParams final : public ParamProvider {
 public:
  DenseParams(const ParamLayout& layout, Backend& backend, DType dtype, bool with_grads);
  ~DenseParams() override;
  DenseParams(const DenseParams&) = delete;
  DenseParams& operator=(const DenseParams&) = delete;

  void init(uint64_t seed, double std = 0.02);
  // Unit u's values from/to a host f32 vector of the unit's unpadded size.
  void set_unit(int u, const std::vector<float>& values);
  std::vector<float> get_unit(int u) const;
  std::vector<double> get_grad_f64(int u) const;  // for tests
  Tensor weights(int u) { return weights_[u]; }
  void zero_grads();

  Tensor acquire(int unit, Pass) override { return weights_.at(unit); }
  void release(int, Pass) override {}
  Tensor grad(int unit) override { return grads_.at(unit); }
  void grad_ready(int) override {}

 private:
  const ParamLayout& layout_;
  Backend& be_;
  DType dt_;
  std::vector<Tensor> weights_, grads_;
};

}  // namespace st
