#pragma once
// mla::Error: the one exception type the library throws. Messages name the argument and the
// expected and actual values, e.g. "pre: slot_mapping[3] = 4096 is out of range [-1, 4096)".
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mla {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  throw Error(os.str());
}
}  // namespace detail

// MLA_REQUIRE(cond, "what", expected, actual...): throws mla::Error when cond is false.
#define MLA_REQUIRE(cond, ...)                        \
  do {                                                \
    if (!(cond)) ::mla::detail::fail(__VA_ARGS__);    \
  } while (0)

}  // namespace mla
