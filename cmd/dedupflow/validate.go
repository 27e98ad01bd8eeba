package main

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// checkAttribute checks an attribute name given in a flag against what
// Pub/Sub accepts, so a bad name fails at start instead of on every message.
func checkAttribute(flag, name string) error {
	switch {
	case name == "":
		return nil
	case len(name) > 256:
		return fmt.Errorf("--%s is %d bytes long; Pub/Sub attribute names are at most 256", flag, len(name))
	case !utf8.ValidString(name):
		return fmt.Errorf("--%s %q is not valid UTF-8", flag, name)
	case strings.HasPrefix(strings.ToLower(name), "goog"):
		return fmt.Errorf("--%s %q: attribute names starting with \"goog\" are reserved by Pub/Sub", flag, name)
	}
	return nil
}

func (j *job) checkAttributes() error {
	for _, a := range []struct{ flag, name string }{
		{"id-attribute", j.idAttr}, {"output-id-attribute", j.outIDAttr},
		{"producer-attribute", j.producerAttr}, {"timestamp-attribute", j.tsAttr},
	} {
		if err := checkAttribute(a.flag, a.name); err != nil {
			return err
		}
	}
	if j.producerAttr != "" && j.idAttr == "" && (j.keyFrom == "" || j.keyFrom == "attribute") {
		return errors.New("--producer-attribute labels messages missing their key, so it needs --id-attribute or --key-from json:PATH")
	}
	return nil
}
