package main

import (
	"flag"
	"fmt"
	"strings"
)

// beamAliases are the Beam pipeline options of the tutorial's Dataflow job,
// by the dedupflow flag each stands for. --project has one name in both.
var beamAliases = map[string]string{
	"inputTopic":         "input-topic",
	"inputSubscription":  "input-subscription",
	"outputTopic":        "output-topic",
	"idAttribute":        "id-attribute",
	"timestampAttribute": "timestamp-attribute",
}

// What to do instead of the Beam options dedupflow does not take.
const (
	leaveOut = "dedupflow runs the pipeline in this process, so it has no use for it; leave it out"
	scaleOut = "to scale out, run more dedupflow pipeline replicas on one subscription, sharing --state redis://…"
)

// beamOthers are the Beam and Dataflow options dedupflow does not take.
var beamOthers = map[string]string{
	"streaming":             "dedupflow always streams; leave it out",
	"jobName":               leaveOut,
	"tempLocation":          leaveOut,
	"gcpTempLocation":       leaveOut,
	"stagingLocation":       leaveOut,
	"templateLocation":      leaveOut,
	"region":                leaveOut,
	"zone":                  leaveOut,
	"workerRegion":          leaveOut,
	"workerZone":            leaveOut,
	"workerMachineType":     leaveOut,
	"diskSizeGb":            leaveOut,
	"network":               leaveOut,
	"subnetwork":            leaveOut,
	"numWorkers":            scaleOut,
	"maxNumWorkers":         scaleOut,
	"autoscalingAlgorithm":  scaleOut,
	"serviceAccount":        "dedupflow uses Application Default Credentials: set GOOGLE_APPLICATION_CREDENTIALS",
	"outputDeadletterTopic": "use --dead-letter-topic",
}

// beamArgs rewrites the Beam options among args into dedupflow's flags,
// so the tutorial's Dataflow command line runs unchanged, and refuses the
// Beam options dedupflow does not take, saying what to use instead.
// notice, when --runner was given, is a line to log about it.
func beamArgs(fs *flag.FlagSet, args []string) (out []string, notice string, err error) {
	out = make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			// The flag package stops here too.
			return append(out, args[i:]...), notice, nil
		}
		dashes := "-"
		if strings.HasPrefix(a, "--") {
			dashes = "--"
		}
		name, value, hasValue := strings.Cut(a[len(dashes):], "=")
		if f := fs.Lookup(name); f != nil {
			out = append(out, a)
			if !hasValue && !isBool(f) && i+1 < len(args) {
				i++
				out = append(out, args[i]) // its value, whatever it looks like
			}
			continue
		}
		if own, ok := beamAliases[name]; ok {
			if hasValue {
				out = append(out, dashes+own+"="+value)
			} else {
				out = append(out, dashes+own)
			}
			continue
		}
		switch hint, other := beamOthers[name]; {
		case name == "runner":
			if !hasValue && i+1 < len(args) {
				i++
				value = args[i]
			}
			notice = fmt.Sprintf("--runner=%s is not needed: dedupflow is the runner, and the pipeline runs in this process", value)
			continue
		case other:
			return nil, "", fmt.Errorf("--%s is a Beam option that dedupflow does not take: %s", name, hint)
		case fs.Lookup(kebab(name)) != nil:
			return nil, "", fmt.Errorf("unknown flag --%s: use --%s", name, kebab(name))
		case kebab(name) != name:
			return nil, "", fmt.Errorf("--%s looks like a Beam option, and dedupflow does not take it (its own flags: dedupflow pipeline -h); "+
				"the Beam options it takes are --project, --inputTopic, --inputSubscription, --outputTopic, --idAttribute, --timestampAttribute and --runner", name)
		}
		out = append(out, a) // unknown: the flag package says so
	}
	return out, notice, nil
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// kebab spells a camelCase name in dedupflow's style: maxOutstanding
// becomes max-outstanding.
func kebab(s string) string {
	var b strings.Builder
	for _, r := range s {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('-')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
