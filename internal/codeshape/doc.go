// Package codeshape holds checks on the shape of the repository's own Go
// code that no linter makes: its test fails when a non-test function grows
// past the length the project keeps functions under.
package codeshape
