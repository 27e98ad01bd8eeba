// Package udf runs Pub/Sub's JavaScript user-defined functions (single
// message transforms) with goja, an embedded JavaScript engine in pure Go.
//
// What it follows, from the JavaScriptUDF field of the v1 API and Google's
// "User Defined Functions (UDFs) overview", in our words:
//   - the code holds a function called function_name, called as
//     fn(message, metadata);
//   - message is {data, attributes}: data is the payload as a string,
//     attributes a map of strings to strings;
//   - metadata holds message_id, publish_time (YYYY-MM-DDTHH:MM:SSZ) and
//     ordering_key, each when the message has one;
//   - returning null filters the message out; returning {data, attributes}
//     replaces the message, data being required, and attributes replacing
//     all attributes (empty or missing attributes leave none);
//   - a thrown error, a wrong return value or a limit passed fails the
//     message for this transform; the caller decides where it goes.
//
// Each message is transformed in a runtime of its own, in which the code's
// top level has just run: what a call leaves in the global scope (var
// seen = []; seen.push(...)), in a closure or on a built-in prototype is gone
// before the next message. The documentation describes a UDF as taking one
// message and promises nothing kept between messages, and the service runs
// a transform on many machines at once, so a UDF cannot count on state it
// keeps; here such a UDF gets the same answer for a message whichever
// message came before, and holds no memory after its call.
//
// Limits, the figures of Google's UDF limits as we read them (20 KB of
// code, 500 ms a message; the stored documentation we could search did not
// show that section, so check them against the current page): the code is
// at most MaxCodeBytes, one call runs at most
// MaxRunTime (goja's Interrupt stops it), and the memory a call can take is
// bounded by what it returns (MaxResultBytes, Pub/Sub's message size);
// goja offers no heap limit, so a call that builds a large value and drops
// it is stopped only by the run time.
package udf

import (
	"errors"
	"fmt"
	"time"

	"github.com/dop251/goja"
)

const (
	// MaxCodeBytes is the size of a UDF's code that the service accepts.
	MaxCodeBytes = 20 << 10
	// MaxRunTime is how long one call may run.
	MaxRunTime = 500 * time.Millisecond
	// MaxResultBytes bounds a returned message: data plus attributes.
	MaxResultBytes = 10 << 20
	// checkTime bounds running the code's top level when it is compiled.
	checkTime = time.Second
)

// Message is a Pub/Sub message as a UDF sees and returns it.
type Message struct {
	Data       []byte
	Attributes map[string]string
}

// Metadata is the UDF's second argument.
type Metadata struct {
	MessageID   string
	PublishTime time.Time
	OrderingKey string
}

// ErrTimeout is the failure of a call that ran longer than MaxRunTime.
var ErrTimeout = errors.New("the function ran longer than " + MaxRunTime.String())

// Func is a compiled UDF, safe for concurrent use: each call builds its
// own runtime from the compiled program.
type Func struct {
	name string
	prog *goja.Program
}

type runtime struct {
	vm *goja.Runtime
	fn goja.Callable
}

// Compile checks the code and the function name and compiles the code once.
// Its errors name the problem in words fit for an InvalidArgument.
func Compile(name, code string) (*Func, error) {
	if name == "" {
		return nil, errors.New("function_name is empty")
	}
	if code == "" {
		return nil, errors.New("code is empty")
	}
	if len(code) > MaxCodeBytes {
		return nil, fmt.Errorf("code is %d bytes, more than the %d allowed", len(code), MaxCodeBytes)
	}
	prog, err := goja.Compile("udf.js", code, false)
	if err != nil {
		return nil, fmt.Errorf("code does not parse: %w", err)
	}
	f := &Func{name: name, prog: prog}
	if _, err := f.newRuntime(checkTime); err != nil {
		return nil, err
	}
	return f, nil
}

// Name is the function's name.
func (f *Func) Name() string { return f.name }

func (f *Func) newRuntime(limit time.Duration) (*runtime, error) {
	vm := goja.New()
	stop := time.AfterFunc(limit, func() { vm.Interrupt(ErrTimeout) })
	_, err := vm.RunProgram(f.prog)
	stop.Stop()
	vm.ClearInterrupt()
	if err != nil {
		return nil, fmt.Errorf("code fails when loaded: %w", err)
	}
	fn, ok := goja.AssertFunction(vm.Get(f.name))
	if !ok {
		return nil, fmt.Errorf("code has no function named %q", f.name)
	}
	return &runtime{vm: vm, fn: fn}, nil
}

// Apply runs the function on m in a fresh runtime. keep is false when the
// function returned null (or undefined): the message is filtered out.
func (f *Func) Apply(m Message, md Metadata) (out Message, keep bool, err error) {
	rt, err := f.newRuntime(MaxRunTime)
	if err != nil {
		return Message{}, false, err
	}
	vm := rt.vm
	// The runtime is dropped after the call, so an interrupt that fires
	// after the call returned is harmless.
	stop := time.AfterFunc(MaxRunTime, func() { vm.Interrupt(ErrTimeout) })
	defer stop.Stop()
	v, err := rt.fn(goja.Undefined(), vm.ToValue(messageArg(vm, m)), vm.ToValue(metadataArg(md)))
	if err != nil {
		var ie *goja.InterruptedError
		if errors.As(err, &ie) {
			return Message{}, false, ErrTimeout
		}
		return Message{}, false, thrown(err)
	}
	return settled(v)
}

// settled reads the returned value, whose getters run code of the UDF that
// goja runs by panicking with its errors; they fail the message like the
// call's own, the run time limit included.
func settled(v goja.Value) (out Message, keep bool, err error) {
	defer func() {
		switch x := recover().(type) {
		case nil:
		case *goja.InterruptedError:
			out, keep, err = Message{}, false, ErrTimeout
		case *goja.Exception:
			out, keep, err = Message{}, false, thrown(x)
		default:
			panic(x)
		}
	}()
	return result(v)
}

func thrown(err error) error {
	var ex *goja.Exception
	if errors.As(err, &ex) {
		return fmt.Errorf("the function threw: %s", ex.Value().String())
	}
	return fmt.Errorf("the function failed: %w", err)
}

func messageArg(vm *goja.Runtime, m Message) *goja.Object {
	obj := vm.NewObject()
	_ = obj.Set("data", string(m.Data))
	attrs := vm.NewObject()
	for k, v := range m.Attributes {
		_ = attrs.Set(k, v)
	}
	_ = obj.Set("attributes", attrs)
	return obj
}

func metadataArg(md Metadata) map[string]any {
	out := map[string]any{}
	if md.MessageID != "" {
		out["message_id"] = md.MessageID
	}
	if !md.PublishTime.IsZero() {
		out["publish_time"] = md.PublishTime.UTC().Format("2006-01-02T15:04:05Z")
	}
	if md.OrderingKey != "" {
		out["ordering_key"] = md.OrderingKey
	}
	return out
}

func result(v goja.Value) (Message, bool, error) {
	if v == nil || goja.IsNull(v) || goja.IsUndefined(v) {
		return Message{}, false, nil
	}
	obj, ok := v.(*goja.Object)
	if !ok || obj.ClassName() != "Object" {
		return Message{}, false, fmt.Errorf("the function returned %s, not an object or null", v.String())
	}
	data := obj.Get("data")
	if data == nil || goja.IsUndefined(data) || goja.IsNull(data) {
		return Message{}, false, errors.New("the returned object has no data")
	}
	if _, isString := data.Export().(string); !isString {
		return Message{}, false, fmt.Errorf("the returned data is %s, not a string", data.ExportType())
	}
	out := Message{Data: []byte(data.String())}
	size := len(out.Data)
	if a := obj.Get("attributes"); a != nil && !goja.IsUndefined(a) && !goja.IsNull(a) {
		ao, ok := a.(*goja.Object)
		if !ok {
			return Message{}, false, errors.New("the returned attributes are not an object")
		}
		keys := ao.Keys()
		if len(keys) > 0 {
			out.Attributes = make(map[string]string, len(keys))
		}
		for _, k := range keys {
			val := ao.Get(k)
			s, isString := val.Export().(string)
			if !isString {
				return Message{}, false, fmt.Errorf("the returned attribute %q is not a string", k)
			}
			out.Attributes[k] = s
			size += len(k) + len(s)
		}
	}
	if size > MaxResultBytes {
		return Message{}, false, fmt.Errorf("the returned message is %d bytes, more than %d", size, MaxResultBytes)
	}
	return out, true, nil
}
