//! A TCP server that accepts connections, reads what it is sent and never answers: the
//! receiver that hangs, for the timeout case.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::AsyncReadExt as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Listens on a loopback port until dropped.
#[derive(Debug)]
pub struct SilentServer {
    address: SocketAddr,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl SilentServer {
    /// Listens on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::Relaxed);
                // Read and drop everything until the peer gives up; answer nothing.
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    while matches!(socket.read(&mut buffer).await, Ok(n) if n > 0) {}
                });
            }
        });
        Ok(SilentServer {
            address,
            connections,
            task,
        })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// How many connections it accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
