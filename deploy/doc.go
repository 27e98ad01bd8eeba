// Package deploy holds no code: its tests check the files users deploy
// dedupflow with — the container image built from ./Dockerfile, the alert
// rules in prometheus/ and the dashboard in grafana/ — against the real
// tools and a running pipeline. The Kubernetes and compose files are checked
// by the module in validate/, which keeps the Kubernetes and compose types
// out of dedupflow's own go.mod.
package deploy
