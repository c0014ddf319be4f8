// The registry of score functions (host/score_ops.h): filled at load time by the
// scores' own files, read when a plan object is built.
#include <map>
#include <string>

#include "host/score_ops.h"

namespace dfgnn {
namespace {

// A function-local static: the registrars run during static initialisation of
// other translation units, in an order C++ does not fix.
std::map<std::string, ScoreOps>& registry() {
  static std::map<std::string, ScoreOps> scores;
  return scores;
}

}  // namespace

ScoreRegistrar::ScoreRegistrar(const ScoreOps& ops) {
  TORCH_CHECK(ops.name != nullptr && ops.check != nullptr && ops.forward != nullptr,
              "dfgnn: a score registers a name, a check and a forward");
  const bool added = registry().emplace(ops.name, ops).second;
  TORCH_CHECK(added, "dfgnn: the score '", ops.name, "' is registered twice");
}

const ScoreOps& find_score(const std::string& name) {
  const auto& scores = registry();
  auto it = scores.find(name);
  if (it == scores.end()) {
    std::string known;
    for (const auto& s : scores) known += (known.empty() ? "" : ", ") + s.first;
    TORCH_CHECK(false, "dfgnn: no score function '", name, "' is compiled into the extension "
                "(registered: ", known, ")");
  }
  return it->second;
}

}  // namespace dfgnn
