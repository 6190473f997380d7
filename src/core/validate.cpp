// PLACEHOLDER: owned by a helper; replaced by the real implementation.
#include "core/validate.hpp"
namespace mla::detail {
void validate_meta(const StageContext&, const char*, const StepMeta&, const KVCache&) {}
void validate_pre(const StageContext&, const TensorView&, const StepMeta&, const KVCache&, const PreOutputs&) {}
void validate_attend(const StageContext&, const TensorView&, const KVCache&, const StepMeta&, const AttendOutputs&) {}
void validate_post(const StageContext&, const AttendOutputs&, const TensorView&, const StepMeta&, const TensorView&) {}
}
