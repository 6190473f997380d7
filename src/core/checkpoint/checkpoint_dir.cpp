#include "core/checkpoint/checkpoint_dir.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mla/error.hpp"

namespace mla::checkpoint {

namespace fs = std::filesystem;

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MLA_REQUIRE(in.good(), "checkpoint: cannot read '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  MLA_REQUIRE(!in.bad(), "checkpoint: reading '", path, "' failed");
  return os.str();
}

CheckpointDir::CheckpointDir(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  MLA_REQUIRE(fs::is_directory(dir_, ec), "checkpoint: '", dir_, "' is not a directory");
  const fs::path index = fs::path(dir_) / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    index_ = index.string();
    const std::string text = read_text_file(index_);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    MLA_REQUIRE(!j.is_discarded() && j.is_object(), "checkpoint: '", index_, "' is not a JSON object");
    const auto map = j.find("weight_map");
    MLA_REQUIRE(map != j.end() && map->is_object(), "checkpoint: '", index_, "' has no 'weight_map' object");
    for (const auto& [name, file] : map->items()) {
      MLA_REQUIRE(file.is_string(), "checkpoint: '", index_, "': weight_map['", name,
                  "'] must be a file name, got ", file.dump());
      const std::string f = file.get<std::string>();
      // Shards live in the directory itself: a path could point anywhere on the machine.
      MLA_REQUIRE(!f.empty() && f.find('/') == std::string::npos && f.find('\\') == std::string::npos &&
                      f != "." && f != "..",
                  "checkpoint: '", index_, "': weight_map['", name, "'] = '", f,
                  "' is not a file name inside the checkpoint directory");
      where_[name] = f;
    }
    return;
  }

  std::vector<std::string> files;
  if (fs::exists(fs::path(dir_) / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    for (const auto& e : fs::directory_iterator(dir_, ec))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
  }
  MLA_REQUIRE(!files.empty(), "checkpoint: '", dir_,
              "' holds neither model.safetensors.index.json nor any *.safetensors file");
  for (const auto& f : files) {
    for (const auto& t : open(f).header().tensors) {
      const auto [it, fresh] = where_.emplace(t.name, f);
      MLA_REQUIRE(fresh, "checkpoint: '", dir_, "': tensor '", t.name, "' is in both '", it->second, "' and '", f,
                  "'");
    }
  }
}

std::vector<std::string> CheckpointDir::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

const safetensors::File& CheckpointDir::open(const std::string& file) {
  auto& slot = files_[file];
  if (!slot) slot = std::make_unique<safetensors::File>((fs::path(dir_) / file).string());
  return *slot;
}

TensorRef CheckpointDir::get(const std::string& name) {
  const auto it = where_.find(name);
  MLA_REQUIRE(it != where_.end(), "checkpoint '", dir_, "': no tensor '", name, "'",
              index_.empty() ? std::string(" in its *.safetensors files")
                             : " in model.safetensors.index.json's weight_map");
  const safetensors::File& f = open(it->second);
  const safetensors::TensorInfo* info = f.find(name);
  MLA_REQUIRE(info != nullptr, "checkpoint '", dir_, "': model.safetensors.index.json maps tensor '", name,
              "' to '", it->second, "', which does not contain it");
  return {&f, info};
}

}  // namespace mla::checkpoint
