#include "model/dense_params.h"

#include "model/init.h"

namespace st {

DenseParams::DenseParams(const ParamLayout& layout, Backend& backend, DType dtype, bool with_grads)
    : layout_(layout), be_(backend), dt_(dtype) {
  for (const Unit& u : layout.units()) {
    weights_.push_back(be_.alloc(dt_, u.numel));
    grads_.push_back(with_grads ? be_.alloc(dt_, u.numel) : Tensor{});
  }
}

DenseParams::~DenseParams() {
  for (auto& t : weights_) be_.free(t);
  for (auto& t : grads_)
    if (!t.empty()) be_.free(t);
}

void DenseParams::init(uint64_t seed, double std) {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const Unit& unit = layout_.unit(u);
    std::vector<float> v(unit.numel);
    init_unit_values(unit, seed, std, 0, unit.numel, v.data());
    set_unit(u, v);
  }
}

void DenseParams::set_unit(int u, const std::vector<float>& values) {
  const Unit& unit = layout_.unit(u);
  ST_CHECK(values.size() == unit.numel, "unit '", unit.name, "' expects ", unit.numel, " values, got ",
           values.size());
  Tensor host_f32{const_cast<float*>(values.data()), DType::F32, values.size()};
  Tensor staging = be_.alloc(DType::F32, unit.numel);
  be_.upload(staging, host_f32.data);
  be_.copy(weights_[u].slice(0, unit.numel), staging);
  be_.free(staging);
}

std::vector<float> DenseParams::get_unit(int u) const {
  const Unit& unit = layout_.unit(u);
  std::vector<float> v(unit.numel);
  Tensor staging = be_.alloc(DType::F32, unit.numel);
  be_.copy(staging, weights_[u].slice(0, unit.numel));
  be_.download(v.data(), staging);
  be_.free(staging);
  return v;
}

std::vector<double> DenseParams::get_grad_f64(int u) const {
  const Unit& unit = layout_.unit(u);
  std::vector<double> v(unit.numel);
  Tensor staging = be_.alloc(DType::F64, unit.numel);
  be_.copy(staging, grads_[u].slice(0, unit.numel));
  be_.download(v.data(), staging);
  be_.free(staging);
  return v;
}

void DenseParams::zero_grads() {
  for (auto& g : grads_)
    if (!g.empty()) be_.zero(g);
}

}  // namespace st
