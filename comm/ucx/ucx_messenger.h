// PeerMessenger over the UCX transport's worker and endpoints: tagged
// messages whose tag has the peer-message bit set (comm/ucx/ucx_core.h), so
// that they never match an exchange's receives. A few receives stay posted
// (as each completes it is queued and re-posted), so poll() never blocks;
// sends are copied and tracked until UCX is done with them. An endpoint or
// send error marks its peer lost.
#pragma once

#include <memory>

#include "comm/peer_messenger.h"

namespace moed::comm {
namespace ucx {
class Core;
}

std::unique_ptr<PeerMessenger> make_ucx_messenger(std::shared_ptr<ucx::Core> core);

}  // namespace moed::comm
