// The config registry: parsing, validation messages, overrides.
#include "util/config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ferry/status.hpp"

namespace ferry::util {
namespace {

std::string error_of(const std::map<std::string, std::string>& overrides) {
  try {
    Config::load(overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsLoadAndEveryVariableHasADoc) {
  Config config = Config::load();
  EXPECT_EQ(config.get_int(Var::kShmFifoSize), 1024);
  for (const auto& spec : registry()) {
    EXPECT_NE(std::string(spec.doc), "") << spec.name;
    EXPECT_EQ(std::string(spec.name).rfind("FERRY_", 0), 0u) << spec.name;
  }
}

TEST(Config, SizesTakeSuffixes) {
  Config config = Config::load({{"FERRY_RNDV_THRESHOLD", "64k"}, {"SHM_BOUNCE_SIZE", "1m"}});
  EXPECT_EQ(config.get_size(Var::kRndvThreshold), 64u * 1024);
  EXPECT_EQ(config.get_size(Var::kShmBounceSize), 1u << 20);
}

TEST(Config, InvalidValuesNameTheVariableTheValueAndWhatIsAllowed) {
  std::string e = error_of({{"FERRY_SHM_FIFO_SIZE", "1000"}});
  EXPECT_NE(e.find("FERRY_SHM_FIFO_SIZE"), std::string::npos) << e;
  EXPECT_NE(e.find("'1000'"), std::string::npos) << e;
  EXPECT_NE(e.find("power of two"), std::string::npos) << e;

  e = error_of({{"FERRY_SHM_FIFO_SIZE", "8"}});
  EXPECT_NE(e.find("[16, 65536]"), std::string::npos) << e;
  e = error_of({{"FERRY_LOG_LEVEL", "loud"}});
  EXPECT_NE(e.find("error|warn|info|debug"), std::string::npos) << e;
  e = error_of({{"FERRY_SHM_CMA", "maybe"}});
  EXPECT_NE(e.find("boolean"), std::string::npos) << e;
  e = error_of({{"FERRY_TRANSPORTS", "shm,carrier-pigeon"}});
  EXPECT_NE(e.find("carrier-pigeon"), std::string::npos) << e;
  e = error_of({{"FERRY_RNDV_THRESHOLD", "12q"}});
  EXPECT_NE(e.find("FERRY_RNDV_THRESHOLD"), std::string::npos) << e;
  e = error_of({{"FERRY_RNDV_THRESHOLD", "-9223372036854775808k"}});  // found by config_value_fuzz
  EXPECT_NE(e.find("FERRY_RNDV_THRESHOLD"), std::string::npos) << e;
  e = error_of({{"FERRY_RNDV_THRESHOLD", "99999999999999999999"}});
  EXPECT_NE(e.find("FERRY_RNDV_THRESHOLD"), std::string::npos) << e;
  e = error_of({{"FERRY_BOOTSTRAP_TIMEOUT", "-1"}});
  EXPECT_NE(e.find("FERRY_BOOTSTRAP_TIMEOUT"), std::string::npos) << e;
  // The on-stream kernel's LL slots hold 256 KiB of a call (cuda::Cuda::kLLMaxBytes).
  e = error_of({{"FERRY_STREAM_LL", "512k"}});
  EXPECT_NE(e.find("[0, 262144]"), std::string::npos) << e;
  // The stream send/recv inbox has ready and taken words for 256 places of its bulk ring
  // (cuda::Cuda::kP2pMaxPlaces).
  e = error_of({{"FERRY_STREAM_RING_PLACES", "512"}});
  EXPECT_NE(e.find("[1, 256]"), std::string::npos) << e;
  e = error_of({{"FERRY_STREAM_RING_CHUNK", "1k"}});
  EXPECT_NE(e.find("FERRY_STREAM_RING_CHUNK"), std::string::npos) << e;
  e = error_of({{"FERRY_NO_SUCH_THING", "1"}});
  EXPECT_NE(e.find("unknown configuration variable"), std::string::npos) << e;
}

TEST(Config, EveryBoundAndWordThatFerryInfoPrintsLoadsAlone) {
  // A value at a variable's printed minimum or maximum, or any of its printed words, set alone
  // (other variables at their defaults), must be accepted: no hidden constraint between them.
  for (const auto& spec : registry()) {
    std::vector<std::string> values;
    switch (spec.type) {
      case VarType::kInt:
      case VarType::kSize:
        for (double bound : {spec.min, spec.max}) {
          values.push_back(std::to_string(static_cast<long long>(bound)));
        }
        break;
      case VarType::kSeconds:
        for (double bound : {spec.min, spec.max}) {
          char text[64];
          std::snprintf(text, sizeof(text), "%.17g", bound);
          values.emplace_back(text);
        }
        break;
      case VarType::kEnum:
      case VarType::kList: {
        std::string allowed = spec.allowed;
        for (std::size_t start = 0; start <= allowed.size();) {
          const std::size_t bar = std::min(allowed.find('|', start), allowed.size());
          values.push_back(allowed.substr(start, bar - start));
          start = bar + 1;
        }
        break;
      }
      case VarType::kBool:
      case VarType::kString:
        continue;
    }
    for (const std::string& value : values) {
      EXPECT_EQ(error_of({{spec.name, value}}), "") << spec.name << "=" << value;
    }
  }
  // The smallest FIFO takes a release batch that fits it.
  Config tiny = Config::load({{"FERRY_SHM_FIFO_SIZE", "16"}});
  EXPECT_EQ(tiny.get_int(Var::kShmReleaseBatch), 8);
}

TEST(Config, ReleaseBatchMustLeaveRoomInTheFifo) {
  std::string e = error_of({{"FERRY_SHM_FIFO_SIZE", "16"}, {"FERRY_SHM_RELEASE_BATCH", "16"}});
  EXPECT_NE(e.find("at most half"), std::string::npos) << e;
}

TEST(Config, EnvironmentIsReadAndOptionsOverrideIt) {
  ::setenv("FERRY_SPIN_COUNT", "77", 1);
  ::setenv("FERRY_SPIN_CUONT", "1", 1);  // a typo is reported as unknown
  Config config = Config::load();
  EXPECT_EQ(config.get_int(Var::kSpinCount), 77);
  bool found = false;
  for (const auto& name : config.unknown()) found = found || name == "FERRY_SPIN_CUONT";
  EXPECT_TRUE(found);
  EXPECT_EQ(Config::load({{"FERRY_SPIN_COUNT", "5"}}).get_int(Var::kSpinCount), 5);
  ::unsetenv("FERRY_SPIN_COUNT");
  ::unsetenv("FERRY_SPIN_CUONT");
}

TEST(Config, BooleansAcceptTheUsualWords) {
  for (const char* yes : {"1", "yes", "on", "true", "Y"}) {
    EXPECT_TRUE(Config::load({{"FERRY_SHM_CMA", yes}}).get_bool(Var::kShmCma)) << yes;
  }
  for (const char* no : {"0", "no", "off", "false", "N"}) {
    EXPECT_FALSE(Config::load({{"FERRY_SHM_CMA", no}}).get_bool(Var::kShmCma)) << no;
  }
}

}  // namespace
}  // namespace ferry::util
