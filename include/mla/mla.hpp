#pragma once
// Everything public in one include.
#include "mla/comm.hpp"
#include "mla/config.hpp"
#include "mla/dcp.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"
#include "mla/layer.hpp"
#include "mla/step.hpp"
#include "mla/tensor.hpp"
#include "mla/weights.hpp"
#include "mla/workspace.hpp"
