// The PMIx bootstrap (Open MPI's mpirun, Slurm's srun --mpi=pmix, PRRTE): libpmix is loaded with
// dlopen, so a machine without it still runs ferry under other launchers. Chosen when PMIX_RANK
// and PMIX_NAMESPACE are set, or by FERRY_BOOTSTRAP=pmix.
#pragma once

#include <memory>

#include "bootstrap/bootstrap.hpp"

namespace ferry::bootstrap {

// Throws ferry::Error(kBootstrapError) naming what failed: no libpmix, no PMIx support in this
// build, PMIx_Init refused, job information missing.
std::unique_ptr<Bootstrap> create_pmix(const util::Config& config);

}  // namespace ferry::bootstrap
