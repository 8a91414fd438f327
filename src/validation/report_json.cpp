#include <torchbridge/validation/tolerances.h>
#include <torchbridge/validation/validator.h>

#include <nlohmann/json.hpp>

#include <cmath>

namespace torchbridge::validation {
namespace {

nlohmann::json number(double value) { return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(); }

}  // namespace

std::string report_json(const ValidationReport& report, int indent) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : report.checks) {
    nlohmann::json item = {{"backend", c.backend}, {"device", c.device}, {"check", c.check},
                           {"subject", c.subject}, {"passed", c.passed}, {"detail", c.detail}};
    if (c.metrics) {
      item["max_abs_error"] = number(c.metrics->max_abs_error);
      item["max_rel_error"] = number(c.metrics->max_rel_error);
      item["rel_l2_error"] = number(c.metrics->rel_l2_error);
      item["cosine_similarity"] = number(c.metrics->cosine_similarity);
    }
    checks.push_back(item);
  }
  nlohmann::json timings = nlohmann::json::object();
  for (const auto& t : report.timings) timings[t.backend] = t.seconds;
  nlohmann::json tolerances = nlohmann::json::array();
  for (const auto& row : tolerance_table()) {
    const auto bound = [](const Bound& b) {
      return nlohmann::json{{"atol", b.atol}, {"rtol", b.rtol}, {"min_cosine", b.min_cosine}};
    };
    tolerances.push_back({{"precision", row.precision}, {"output", bound(row.output)}, {"gradient", bound(row.gradient)}});
  }
  const nlohmann::json out = {
      {"schema", "torchbridge.validation/1"},
      {"model_kind", report.model_kind},
      {"precision", report.precision},
      {"reference", report.reference},
      {"backends", report.backends},
      {"valid", report.is_valid()},
      {"passed", report.passed()},
      {"failed", report.failed()},
      {"total_tests", report.total_tests()},
      {"checks", checks},
      {"not_checked", report.not_checked},
      {"seconds", {{"reference", report.reference_seconds}, {"backends", timings}}},
      {"tolerances", tolerances},
  };
  return out.dump(indent);
}

}  // namespace torchbridge::validation
