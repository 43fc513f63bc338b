//! This node's address as others reach it: the local end of the route to a peer (a job master,
//! the brain). Agents advertise it to the master and serve on it; a job master started on a
//! cluster node (`job-master run --advertise auto`) advertises it to its agents.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs, UdpSocket};

/// The address this node reaches `peer` from (`http://host:port`, `host:port`, with or without
/// a trailing `/`): the local end of a UDP socket "connected" to it, a route lookup that sends
/// no packet. On one machine that is 127.0.0.1; on a cluster, the node's address on the network
/// the peer is on. Looks the host name up (blocking).
pub fn route_source(peer: &str) -> io::Result<IpAddr> {
    let authority = peer
        .split_once("://")
        .map_or(peer, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    let target = authority.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{authority} resolves to no address"),
        )
    })?;
    let unspecified: IpAddr = if target.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let socket = UdpSocket::bind((unspecified, 0))?;
    socket.connect(target)?;
    Ok(socket.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_is_the_local_end_of_the_route_to_the_peer() {
        let local: IpAddr = Ipv4Addr::LOCALHOST.into();
        assert_eq!(route_source("http://127.0.0.1:5000").unwrap(), local);
        assert_eq!(route_source("127.0.0.1:5000/").unwrap(), local);
        assert_eq!(route_source("http://127.0.0.1:5000/api/x").unwrap(), local);
        assert!(matches!(
            route_source("http://[::1]:5000"),
            Ok(IpAddr::V6(_)) | Err(_)
        ));
        assert!(route_source("http://no-such-host.invalid:5000").is_err());
        assert!(route_source("no-port").is_err());
    }
}
