package limits

import (
	"errors"
	"strings"
	"testing"
)

func TestMessage(t *testing.T) {
	big := strings.Repeat("x", MessageBytes)
	for _, c := range []struct {
		name  string
		data  string
		attrs map[string]string
		okey  string
		want  error
		size  int
	}{
		{name: "data only", data: "hi", size: 2},
		{name: "attributes only", attrs: map[string]string{"k": "v"}, size: 2},
		{name: "everything counts", data: "ab", attrs: map[string]string{"key": "val"}, okey: "o", size: 9},
		{name: "empty", want: ErrEmptyMessage},
		{name: "exactly 10 MB", data: big, size: MessageBytes},
		{name: "10 MB and one byte", data: big, attrs: map[string]string{"k": ""}, want: ErrTooLarge},
		{name: "empty key", data: "x", attrs: map[string]string{"": "v"}, want: ErrAttributeKey},
		{name: "key of 257 bytes", data: "x", attrs: map[string]string{strings.Repeat("k", 257): "v"}, want: ErrAttributeKey},
		{name: "reserved key", data: "x", attrs: map[string]string{"GOOG_x": "v"}, want: ErrAttributeKey},
		{name: "key not UTF-8", data: "x", attrs: map[string]string{"a\xff": "v"}, want: ErrAttributeKey},
		{name: "value of 1025 bytes", data: "x", attrs: map[string]string{"k": strings.Repeat("v", 1025)}, want: ErrAttributeValue},
		{name: "value of 1024 bytes", data: "x", attrs: map[string]string{"k": strings.Repeat("v", 1024)}, size: 1026},
		{name: "value not UTF-8", data: "x", attrs: map[string]string{"k": "\xc3"}, want: ErrAttributeValue},
		{name: "ordering key too long", data: "x", okey: strings.Repeat("o", 1025), want: ErrOrderingKey},
		{name: "ordering key not UTF-8", data: "x", okey: "\xff", want: ErrOrderingKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			size, err := Message([]byte(c.data), c.attrs, c.okey)
			if !errors.Is(err, c.want) || (c.want == nil && size != c.size) {
				t.Fatalf("Message = %d, %v; want %d, %v", size, err, c.size, c.want)
			}
		})
	}
	attrs := map[string]string{}
	for i := 0; i < Attributes+1; i++ {
		attrs[strings.Repeat("a", i+1)] = ""
	}
	if _, err := Message(nil, attrs, ""); !errors.Is(err, ErrTooManyAttributes) {
		t.Fatalf("101 attributes: %v", err)
	}
}

func TestID(t *testing.T) {
	for id, ok := range map[string]bool{
		"abc": true, "a-b_c.d~e+f%g": true, "T" + strings.Repeat("x", 254): true,
		"ab": false, "1abc": false, "googthing": false, "Goog-x": false, "a b c": false,
		"abcé": false, "T" + strings.Repeat("x", 255): false,
	} {
		if err := ID(id); (err == nil) != ok || (err != nil && !errors.Is(err, ErrID)) {
			t.Errorf("ID(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}

func TestLabels(t *testing.T) {
	many := map[string]string{}
	for i := range LabelsPerResource + 1 {
		many[strings.Repeat("k", i+1)] = ""
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   error
	}{
		{"none", nil, nil},
		{"usual", map[string]string{"team": "shop", "env_1": "prod-eu", "empty": ""}, nil},
		{"international", map[string]string{"équipe": "café", "チーム": "店"}, nil},
		{"63 characters", map[string]string{strings.Repeat("k", 63): strings.Repeat("é", 63)}, nil},
		{"upper-case key", map[string]string{"Team": "shop"}, ErrLabel},
		{"upper-case value", map[string]string{"team": "Shop"}, ErrLabel},
		{"key starts with a digit", map[string]string{"1team": "x"}, ErrLabel},
		{"key starts with _", map[string]string{"_team": "x"}, ErrLabel},
		{"empty key", map[string]string{"": "x"}, ErrLabel},
		{"dot", map[string]string{"a.b": "x"}, ErrLabel},
		{"64-character key", map[string]string{strings.Repeat("k", 64): ""}, ErrLabel},
		{"64-character value", map[string]string{"k": strings.Repeat("v", 64)}, ErrLabel},
		{"value not UTF-8", map[string]string{"k": "\xff"}, ErrNotUTF8},
		{"65 labels", many, ErrLabel},
	} {
		if err := Labels(c.labels); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: Labels = %v, want %v", c.name, err, c.want)
		}
	}
}

func TestProject(t *testing.T) {
	for _, id := range []string{"p", "test", "dedupflow-test", "my-project-123", "example.com:my-project", strings.Repeat("a", 30)} {
		if err := Project(id); err != nil {
			t.Errorf("Project(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range []string{"", "P!", "P", "My-project", "1project", "project-", "my_project", "a b", strings.Repeat("a", 31), ":p", "Example.com:p"} {
		if err := Project(id); !errors.Is(err, ErrProject) {
			t.Errorf("Project(%q) = %v, want ErrProject", id, err)
		}
	}
}
