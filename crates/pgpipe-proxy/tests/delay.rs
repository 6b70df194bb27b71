//! The proxy delays every byte by its one-way delay in each direction, on
//! every connection, however many share it.

use std::time::{Duration, Instant};

use pgpipe_proxy::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod support;
use support::echo_server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_byte_comes_back_before_the_round_trip() {
    let server = echo_server().await;
    let proxy = Proxy::builder(server.to_string())
        .delay(Duration::from_micros(500))
        .start()
        .unwrap();
    let mut clients = Vec::new();
    for c in 0..4u8 {
        let addr = proxy.addr();
        clients.push(tokio::spawn(async move {
            let stream = TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut read, mut write) = stream.into_split();
            // Writer: 2000 one-byte pings in bursts, each stamped just
            // before it is written (a stamp taken after could be late by
            // however long the thread was preempted in between).
            let (stamps_tx, mut stamps_rx) = tokio::sync::mpsc::unbounded_channel();
            let writer = tokio::spawn(async move {
                for i in 0..2000u32 {
                    stamps_tx.send(Instant::now()).unwrap();
                    write.write_all(&[c]).await.unwrap();
                    if i % 16 == 0 {
                        tokio::time::sleep(Duration::from_micros(300)).await;
                    }
                }
            });
            let mut shortest = Duration::MAX;
            let mut buf = [0u8; 4096];
            let mut received = 0;
            while received < 2000 {
                let n = read.read(&mut buf).await.unwrap();
                let now = Instant::now();
                for _ in 0..n {
                    let sent = stamps_rx.recv().await.unwrap();
                    shortest = shortest.min(now - sent);
                }
                received += n;
            }
            writer.await.unwrap();
            shortest
        }));
    }
    for client in clients {
        let shortest = client.await.unwrap();
        assert!(
            shortest >= Duration::from_millis(1),
            "a byte came back after {shortest:?}"
        );
    }
}
