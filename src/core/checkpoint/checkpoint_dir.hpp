#pragma once
// The tensors of a Hugging Face checkpoint directory: model.safetensors.index.json's weight_map
// (sharded), else model.safetensors, else every *.safetensors file. Shards are opened (memory
// mapped, header parsed) only when one of their tensors is asked for: a DeepSeek-V3 layer touches
// two or three of its 163 shards.
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/checkpoint/safetensors.hpp"

namespace mla::checkpoint {

struct TensorRef {
  const safetensors::File* file = nullptr;
  const safetensors::TensorInfo* info = nullptr;
  std::span<const uint8_t> bytes() const { return file->bytes(*info); }
};

class CheckpointDir {
 public:
  explicit CheckpointDir(std::string dir);  // mla::Error when it holds no safetensors

  const std::string& dir() const { return dir_; }
  bool contains(std::string_view name) const { return where_.count(std::string(name)) > 0; }
  // Every tensor name the directory holds (the index's names for a sharded checkpoint).
  std::vector<std::string> names() const;
  // mla::Error when no file holds the tensor, or its shard does not contain it after all.
  TensorRef get(const std::string& name);

 private:
  const safetensors::File& open(const std::string& file);

  std::string dir_;
  std::string index_;                          // the index's path, empty for unsharded checkpoints
  std::map<std::string, std::string> where_;   // tensor name -> file name (inside dir_)
  std::map<std::string, std::unique_ptr<safetensors::File>> files_;
};

// The whole file as text; mla::Error naming `path` when it cannot be read.
std::string read_text_file(const std::string& path);

}  // namespace mla::checkpoint
