// PLACEHOLDER: owned by a helper; replaced by the real implementation.
#include "support/testing.hpp"
