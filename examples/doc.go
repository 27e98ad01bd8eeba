// Package examples holds the tests that run the tutorial's own programs,
// written in Java in the folders beside it, against dedupflow: the Spring
// Cloud Stream app (spring-tutorial) against `dedupflow up`, and Beam's
// PubsubIO on the DirectRunner (beam-reference) side by side with `dedupflow
// pipeline`. scripts/test.sh builds their jars with Maven.
package examples
