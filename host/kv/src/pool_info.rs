//! [`PoolInfo`]: what a compute node needs to connect to a memory node's
//! pool, handed over in process or through the bootstrap.

use rolex_core::wire::MrDesc;

/// What a compute node needs to connect: the pool's descriptor and the
/// layout version it was built with.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolInfo {
    /// The registered pool (read, write and atomic rights).
    pub desc: MrDesc,
    /// The pool's layout version.
    pub layout_version: u32,
}

#[cfg(feature = "libfabric")]
impl PoolInfo {
    /// The pool a memory node offers over the bootstrap connection (see
    /// `rolex_memnode::MemoryNode::offer`): its first descriptor and its layout version;
    /// `None` if the offer holds no descriptor.
    pub fn from_offer(offer: &rolex_engine::domain::fabric::bootstrap::Offer) -> Option<Self> {
        Some(PoolInfo {
            desc: offer.descs.first()?.clone(),
            layout_version: offer.layout_version,
        })
    }
}
