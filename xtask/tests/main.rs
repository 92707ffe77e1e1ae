//! xtask's tests: the tidy checks that reviewers would otherwise repeat by hand.

mod boundaries;
mod tidy;
