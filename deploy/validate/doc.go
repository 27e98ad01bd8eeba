// Package validate holds no code: its tests decode the Kubernetes example
// (../kubernetes) strictly into the Kubernetes API types and load
// ../compose.yaml with the compose specification's own loader and schema,
// so an unknown or misspelled field fails. It is a module of its own so that
// those types stay out of dedupflow's go.mod; scripts/test.sh runs it.
package validate
