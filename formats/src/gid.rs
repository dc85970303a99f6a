//! RoCE v2 GIDs and the IP addresses they stand for: one definition for every crate (the agent's
//! transports, the inventory, pinglist generation, the simulator), so that the same address
//! never maps to two GIDs.

use std::net::{IpAddr, Ipv6Addr};

/// The RoCE v2 GID of an address: IPv4-mapped (`::ffff:a.b.c.d`) for IPv4, the address itself
/// for IPv6.
pub fn gid_of(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// [`gid_of`] as the 16 bytes in network order that records and verbs carry.
pub fn gid_bytes(ip: IpAddr) -> [u8; 16] {
    gid_of(ip).octets()
}

/// The address a GID stands for: IPv4 for an IPv4-mapped GID, else the GID as IPv6.
pub fn ip_of(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_is_mapped_and_maps_back_ipv6_is_itself() {
        let v4: IpAddr = "10.0.1.7".parse().expect("v4");
        assert_eq!(gid_of(v4).to_string(), "::ffff:10.0.1.7");
        assert_eq!(ip_of(&gid_bytes(v4)), v4);
        let v6: IpAddr = "fd00::5".parse().expect("v6");
        assert_eq!(ip_of(&gid_bytes(v6)), v6);
    }
}
