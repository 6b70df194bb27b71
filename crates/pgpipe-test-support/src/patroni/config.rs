//! The configuration file of one member of a [`Patroni`] cluster.

use std::{fs, io};

use super::{Node, Patroni, SCOPE};
use crate::hand_to_postgres_user;

impl Patroni {
    pub(super) fn write_config(&self, n: usize, node: &Node, etcd: u16) -> io::Result<()> {
        let dir = self.dir.display();
        let (pg, api) = (node.pg_port, node.api_port);
        let config = format!(
            "scope: {SCOPE}
namespace: /pgpipe/
name: n{n}
log:
  level: INFO
  dir: {dir}/log{n}
restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}
etcd3:
  hosts: 127.0.0.1:{etcd}
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    primary_start_timeout: 0
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_level: replica
        hot_standby: 'on'
        wal_log_hints: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 200
        fsync: 'off'
  initdb:
    - encoding: UTF8
    - locale: C
    - auth: trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {dir}/data{n}
  bin_dir: {bin}
  pgpass: {dir}/pgpass{n}
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: {dir}
",
            bin = self.bin.display(),
        );
        let path = self.config(n);
        fs::write(&path, config)?;
        hand_to_postgres_user(&path)?;
        let logs = self.dir.join(format!("log{n}"));
        fs::create_dir_all(&logs)?;
        hand_to_postgres_user(&logs)
    }
}
