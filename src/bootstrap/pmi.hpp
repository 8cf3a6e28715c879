// The PMI-1 bootstrap: the simple PMI wire protocol, spoken over the socket the launcher passes as
// PMI_FD (MPICH's hydra mpiexec, Slurm's srun --mpi=pmi2, which also answers PMI-1). No library is
// needed. Values are hex-encoded and split into keys that fit the launcher's vallen_max; ranks on
// one node are found by comparing node identities (util/node.hpp), as PMI-1 has no locality.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/bootstrap.hpp"

namespace ferry::bootstrap {

namespace pmi {

// One reply line "cmd=NAME k1=v1 k2=v2" into its fields ("cmd" included). False for a line
// that is not a sequence of key=value words.
bool parse_line(const std::string& line, std::vector<std::pair<std::string, std::string>>* fields);
// Lowercase hex of `bytes`, and back (false for odd lengths or non-hex characters).
std::string to_hex(std::span<const std::byte> bytes);
bool from_hex(const std::string& text, std::vector<std::byte>* bytes);

}  // namespace pmi

// Throws ferry::Error(kBootstrapError) naming what failed (PMI_FD unusable, the launcher refused
// init, PMI_RANK/PMI_SIZE missing or out of range).
std::unique_ptr<Bootstrap> create_pmi(const util::Config& config);

}  // namespace ferry::bootstrap
