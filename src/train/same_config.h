// Every rank must run the same configuration: a rank with another seed or shape would silently
// train a different model, or hang in a collective of another size.
#pragma once

#include <map>
#include <string>

#include "parallel/comm.h"

namespace frugal {

// " key = 'mine' (rank 0: 'theirs');" for each key whose value differs from the reference's
// ("(absent)" where the reference lacks it), `reference_name` naming it ("rank 0"); empty when
// they agree.
std::string config_differences(const std::map<std::string, std::string>& mine,
                               const std::map<std::string, std::string>& reference,
                               const std::string& reference_name);

// Compares every rank's resolved keys with rank 0's (a collective); an Error on every rank
// when any differs, naming the keys on the ranks that differ.
void check_same_config(Comm& world, const std::map<std::string, std::string>& resolved);

}  // namespace frugal
