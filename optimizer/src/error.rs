//! The optimizer's one error type.

/// Why a policy returned no allocation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("invalid problem: {0}")]
    InvalidProblem(String),
    #[error("invalid policy settings: {0}")]
    InvalidConfig(String),
    #[error("the problem is infeasible: {0}")]
    Infeasible(String),
    #[error("the LP solver failed: {0}")]
    Solver(String),
    /// A scheduler returned an assignment the cluster cannot honour (a policy bug).
    #[error("invalid assignment: {0}")]
    InvalidAssignment(String),
    /// A replay broke one of the simulator's invariants (a simulator bug, or input it should
    /// have refused): its numbers would be wrong, so none are given.
    #[error("the replay broke an invariant: {0}")]
    Invariant(String),
}
