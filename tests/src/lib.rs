//! Integration test harness.
