// The registry of score functions (host/score_ops.h): each score's file
// registers its ScoreOps at load time (DFGNN_REGISTER_SCORE); the generic
// attention ops find them by the name their Python spec uses.
#include <map>
#include <mutex>
#include <string>

#include "host/score_ops.h"

namespace dfgnn {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, ScoreOps> scores;
};

// Constructed on first use: registrars in other translation units run during
// static initialisation, in no fixed order.
Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

}  // namespace

ScoreRegistrar::ScoreRegistrar(const ScoreOps& ops) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  TORCH_CHECK(r.scores.emplace(ops.name, ops).second, "dfgnn: score '", ops.name,
              "' is registered twice");
}

const ScoreOps& find_score(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto it = r.scores.find(name);
  if (it == r.scores.end()) {
    std::string known;
    for (const auto& [n, ops] : r.scores) known += (known.empty() ? "" : ", ") + n;
    TORCH_CHECK(false, "dfgnn: no score function '", name, "' (registered: ", known, ")");
  }
  return it->second;
}

}  // namespace dfgnn
