#include <torchbridge/precision.h>
#include <torchbridge/validation/validator.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::validation {
namespace {

nlohmann::json number(double value) { return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(); }

// JSON null is how a non-finite error was written; it reads back as NaN (unknown, not zero).
double number_from(const nlohmann::json& value) {
  return value.is_null() ? std::numeric_limits<double>::quiet_NaN() : value.get<double>();
}

}  // namespace

std::string report_json(const ValidationReport& report, int indent) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : report.checks) {
    nlohmann::json item = {{"backend", c.backend}, {"device", c.device}, {"check", check_name(c.check)},
                           {"subject", c.subject}, {"passed", c.passed}, {"detail", c.detail}};
    if (c.metrics) {
      item["max_abs_error"] = number(c.metrics->max_abs_error);
      // Determinism and the round trip measure the largest difference between two runs only;
      // the other fields would be Metrics' defaults, reported as if measured.
      if (c.check == CheckKind::kOutput || c.check == CheckKind::kGradient) {
        item["max_rel_error"] = number(c.metrics->max_rel_error);
        item["rel_l2_error"] = number(c.metrics->rel_l2_error);
        item["cosine_similarity"] = number(c.metrics->cosine_similarity);
      }
    }
    checks.push_back(item);
  }
  nlohmann::json timings = nlohmann::json::object();
  for (const auto& t : report.timings) timings[t.backend] = t.seconds;
  nlohmann::json tolerances = nlohmann::json::array();
  for (const auto& row : precision_table()) {
    const auto bound = [](const Bound& b) {
      return nlohmann::json{{"atol", b.atol}, {"rtol", b.rtol}, {"min_cosine", b.min_cosine}};
    };
    tolerances.push_back({{"precision", row.name}, {"output", bound(row.output)}, {"gradient", bound(row.gradient)}});
  }
  const nlohmann::json out = {
      {"schema", "torchbridge.validation/1"},
      {"model_kind", report.model_kind},
      {"precision", name_of(report.precision)},
      {"reference", report.reference},
      {"checkpointing", report.checkpointing},
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

ValidationReport report_from_json(const std::string& text) {
  nlohmann::json in;
  try {
    in = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, "not a validation report: the JSON does not parse (", e.what(), ")");
  }
  TORCH_CHECK_VALUE(in.is_object() && in.value("schema", "") == "torchbridge.validation/1",
                    "not a validation report: expected schema 'torchbridge.validation/1'");
  try {
    ValidationReport report;
    report.model_kind = in.at("model_kind").get<std::string>();
    report.precision = parse_precision(in.at("precision").get<std::string>());
    report.reference = in.at("reference").get<std::string>();
    report.checkpointing = in.value("checkpointing", false);
    report.backends = in.at("backends").get<std::vector<std::string>>();
    for (const auto& c : in.at("checks")) {
      CheckRecord record{c.at("backend").get<std::string>(), c.at("device").get<std::string>(),
                         parse_check_kind(c.at("check").get<std::string>()), c.at("subject").get<std::string>(),
                         c.at("passed").get<bool>(),         std::nullopt,
                         c.at("detail").get<std::string>()};
      if (c.contains("rel_l2_error")) {
        record.metrics = Metrics{number_from(c.at("max_abs_error")), number_from(c.at("max_rel_error")),
                                 number_from(c.at("rel_l2_error")), number_from(c.at("cosine_similarity"))};
      } else if (c.contains("max_abs_error")) {
        record.metrics = Metrics{};
        record.metrics->max_abs_error = number_from(c.at("max_abs_error"));
      }
      report.checks.push_back(std::move(record));
    }
    report.not_checked = in.at("not_checked").get<std::vector<std::string>>();
    const auto& seconds = in.at("seconds");
    report.reference_seconds = seconds.at("reference").get<double>();
    // Timings in the order of the backends list (a JSON object keeps no order of its own).
    for (const auto& backend : report.backends) {
      if (seconds.at("backends").contains(backend)) {
        report.timings.push_back({backend, seconds.at("backends").at(backend).get<double>()});
      }
    }
    return report;
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, "malformed validation report: ", e.what());
  }
}

}  // namespace torchbridge::validation
