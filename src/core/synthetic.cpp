// PLACEHOLDER: owned by a helper; replaced by the real implementation.
#include "core/synthetic.hpp"
