//! Kubernetes types, client construction and the in-process API server.
pub mod apiserver;
pub mod crd;
pub mod node_agent;
pub mod seed;
