// The Python module pyg_dfgnn._C: importing it loads the library and runs the op
// registrations (bindings.cpp and the files of ops beside it), and it holds a
// direct entry to the forward ops (and the GT projections) for the eager host
// path.
//
// A small graph's training step is host-bound (docs/steps.md, "Host path"), and
// torch.ops.dfgnn.attention_fwd(*args) parses its arguments against the
// schema in Python's op wrapper (torch function checks, JIT type matching per
// argument) before the dispatcher sees them. _C.attention_fwd(*args) takes the same
// positional arguments, converts them to the kernels' C++ types (attention_sig.h)
// and calls the same operator through the dispatcher, unboxed; _C.projections
// converts by the schema's argument kinds and calls it boxed. Either way autograd
// (the Autograd kernels in attention.cpp and projections.cpp), the profiler's
// record, inference mode and Python dispatch modes act as on the torch.ops path.
// Python-level dispatch (__torch_function__ of tensor subclasses and
// TorchFunctionModes) does not: a tensor argument that is not an
// exact torch.Tensor returns NotImplemented, and pyg_dfgnn.ops takes the torch.ops
// path for it, for torch function modes and under torch.compile
// (pyg_dfgnn/ops/direct.py, call_op).
//
// It also holds the plan resolver (call_token.h): the Python function that
// builds the plan of a forward call compiled code makes, registered by
// pyg_dfgnn.ops.calls when it is imported.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "glue/attention_sig.h"
#include "glue/call_plan.h"
#include "glue/call_token.h"

namespace dfgnn {
namespace {

// Releases the GIL for the operator call, as the torch.ops path does.
struct GilRelease {
  PyThreadState* state = PyEval_SaveThread();
  ~GilRelease() { PyEval_RestoreThread(state); }
};

constexpr char kAttentionFwd[] = "dfgnn::attention_fwd";
constexpr char kProjections[] = "dfgnn::projections";

// What a converter did with an argument.
enum class Pushed { kOk, kSubclass, kError };

// Raises TypeError through the C API, not a C++ exception: the argument checks
// run before anything is allocated, so nothing needs unwinding, and a wrong call
// raises the same way whichever torch the extension was built against.
Pushed type_error(const char* op, const c10::Argument& arg, const char* want, PyObject* o) {
  PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be %s, got %s", op, arg.name().c_str(),
               want, Py_TYPE(o)->tp_name);
  return Pushed::kError;
}

Pushed unconverted(const char* op, const c10::Argument& arg, const c10::TypePtr& type) {
  PyErr_Format(PyExc_RuntimeError,
               "%s: argument '%s' has a type the direct entry does not convert: %s", op,
               arg.name().c_str(), type->str().c_str());
  return Pushed::kError;
}

// The converters of one Python argument `o` for the schema's argument `arg`
// into a C++ value: the generic path (push_arg) and the typed entry of
// attention_fwd share them.
Pushed tensor_arg(PyObject* o, const c10::Argument& arg, const char* op, at::Tensor& t) {
  if (!THPVariable_Check(o)) return type_error(op, arg, "a Tensor", o);
  if (!THPVariable_CheckExact(o)) return Pushed::kSubclass;
  t = THPVariable_Unpack(o);
  return Pushed::kOk;
}

Pushed int_arg(PyObject* o, const c10::Argument& arg, const char* op, int64_t& v) {
  if (!PyLong_Check(o) || PyBool_Check(o)) return type_error(op, arg, "an int", o);
  const long long x = PyLong_AsLongLong(o);
  if (x == -1 && PyErr_Occurred()) return Pushed::kError;
  v = static_cast<int64_t>(x);
  return Pushed::kOk;
}

Pushed float_arg(PyObject* o, const c10::Argument& arg, const char* op, double& v) {
  if (!PyFloat_Check(o) && !PyLong_Check(o)) return type_error(op, arg, "a float", o);
  v = PyFloat_AsDouble(o);
  return v == -1.0 && PyErr_Occurred() ? Pushed::kError : Pushed::kOk;
}

Pushed bool_arg(PyObject* o, const c10::Argument& arg, const char* op, bool& v) {
  if (!PyBool_Check(o)) return type_error(op, arg, "a bool", o);
  v = o == Py_True;
  return Pushed::kOk;
}

// A list or tuple of numbers: double (floats and ints) or int64_t (ints).
template <typename Num>
Pushed numbers_arg(PyObject* o, const c10::Argument& arg, const char* op, std::vector<Num>& v) {
  constexpr bool kFloat = std::is_same_v<Num, double>;
  const char* want = kFloat ? "a list of floats" : "a list of ints";
  if (!PyList_Check(o) && !PyTuple_Check(o)) return type_error(op, arg, "a list or tuple", o);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  PyObject** items = PySequence_Fast_ITEMS(o);
  v.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const bool is_int = PyLong_Check(items[i]) && !PyBool_Check(items[i]);
    if (!is_int && !(kFloat && PyFloat_Check(items[i]))) return type_error(op, arg, want, items[i]);
    if constexpr (kFloat) {
      const double x = PyFloat_AsDouble(items[i]);
      if (x == -1.0 && PyErr_Occurred()) return Pushed::kError;
      v.push_back(x);
    } else {
      const long long x = PyLong_AsLongLong(items[i]);
      if (x == -1 && PyErr_Occurred()) return Pushed::kError;
      v.push_back(static_cast<int64_t>(x));
    }
  }
  return Pushed::kOk;
}

// A list or tuple of exact tensors: Elem at::Tensor (Tensor[]) or
// std::optional<at::Tensor> (Tensor?[], None allowed).
template <typename Elem>
Pushed tensors_arg(PyObject* o, const c10::Argument& arg, const char* op, std::vector<Elem>& v) {
  constexpr bool kOptional = !std::is_same_v<Elem, at::Tensor>;
  if (!PyList_Check(o) && !PyTuple_Check(o)) return type_error(op, arg, "a list or tuple", o);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  PyObject** items = PySequence_Fast_ITEMS(o);
  v.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* t = items[i];
    if (kOptional && t == Py_None) {
      v.emplace_back();
      continue;
    }
    if (!THPVariable_Check(t)) return type_error(op, arg, "a list of Tensors", t);
    if (!THPVariable_CheckExact(t)) return Pushed::kSubclass;
    v.emplace_back(THPVariable_Unpack(t));
  }
  return Pushed::kOk;
}

// A torch.classes object of `type` (the plan).
Pushed object_arg(PyObject* o, const c10::Argument& arg, const char* op,
                  const c10::TypePtr& type, c10::IValue& v) {
  try {
    v = torch::jit::toIValue(o, type);
  } catch (const std::exception&) {
    return type_error(op, arg, type->str().c_str(), o);
  }
  return Pushed::kOk;
}

// Converts a list or tuple `o` for a list argument of element type `elem`
// (Tensor, Tensor?, int or float) into `stack`.
Pushed push_list(PyObject* o, const c10::Argument& arg, const c10::TypePtr& elem, const char* op,
                 torch::jit::Stack& stack) {
  const bool optional = elem->kind() == c10::TypeKind::OptionalType;
  const c10::TypePtr inner = optional ? elem->castRaw<c10::OptionalType>()->getElementType() : elem;
  Pushed p = Pushed::kOk;
  if (inner->kind() == c10::TypeKind::FloatType && !optional) {
    std::vector<double> v;
    if ((p = numbers_arg(o, arg, op, v)) == Pushed::kOk) stack.emplace_back(c10::List<double>(v));
  } else if (inner->kind() == c10::TypeKind::IntType && !optional) {
    std::vector<int64_t> v;
    if ((p = numbers_arg(o, arg, op, v)) == Pushed::kOk) stack.emplace_back(c10::List<int64_t>(v));
  } else if (inner->kind() != c10::TypeKind::TensorType) {
    return unconverted(op, arg, arg.type());
  } else if (optional) {
    std::vector<std::optional<at::Tensor>> v;
    if ((p = tensors_arg(o, arg, op, v)) == Pushed::kOk) {
      c10::List<std::optional<at::Tensor>> list;
      list.reserve(v.size());
      for (auto& t : v) list.push_back(std::move(t));
      stack.emplace_back(std::move(list));
    }
  } else {
    std::vector<at::Tensor> v;
    if ((p = tensors_arg(o, arg, op, v)) == Pushed::kOk)
      stack.emplace_back(c10::List<at::Tensor>(std::move(v)));
  }
  return p;
}

// Converts args[i] for the schema's argument `arg`; kSubclass: a tensor subclass
// (the caller returns NotImplemented); kError: a Python error is set.
Pushed push_arg(PyObject* o, const c10::Argument& arg, const char* op, torch::jit::Stack& stack) {
  c10::TypePtr type = arg.type();
  if (type->kind() == c10::TypeKind::OptionalType) {
    if (o == Py_None) {
      stack.emplace_back();
      return Pushed::kOk;
    }
    type = type->castRaw<c10::OptionalType>()->getElementType();
  }
  Pushed p = Pushed::kOk;
  switch (type->kind()) {
    case c10::TypeKind::TensorType: {
      at::Tensor t;
      if ((p = tensor_arg(o, arg, op, t)) == Pushed::kOk) stack.emplace_back(std::move(t));
      return p;
    }
    case c10::TypeKind::IntType: {
      int64_t v = 0;
      if ((p = int_arg(o, arg, op, v)) == Pushed::kOk) stack.emplace_back(v);
      return p;
    }
    case c10::TypeKind::FloatType: {
      double v = 0.0;
      if ((p = float_arg(o, arg, op, v)) == Pushed::kOk) stack.emplace_back(v);
      return p;
    }
    case c10::TypeKind::BoolType: {
      bool v = false;
      if ((p = bool_arg(o, arg, op, v)) == Pushed::kOk) stack.emplace_back(v);
      return p;
    }
    case c10::TypeKind::ListType:
      return push_list(o, arg, type->castRaw<c10::ListType>()->getElementType(), op, stack);
    case c10::TypeKind::ClassType: {  // a torch.classes object (the plan)
      c10::IValue v;
      if ((p = object_arg(o, arg, op, type, v)) == Pushed::kOk) stack.emplace_back(std::move(v));
      return p;
    }
    default:
      return unconverted(op, arg, type);
  }
}

// A new Python list of `ts`; throws python_error (a Python error set) on failure.
PyObject* wrap_tensors(at::TensorList ts) {
  PyObject* l = PyList_New(static_cast<Py_ssize_t>(ts.size()));
  if (l == nullptr) throw python_error();
  for (size_t i = 0; i < ts.size(); ++i) {
    PyObject* t = THPVariable_Wrap(ts[i]);
    if (t == nullptr) {
      Py_DECREF(l);
      throw python_error();
    }
    PyList_SET_ITEM(l, static_cast<Py_ssize_t>(i), t);
  }
  return l;
}

// _C.<op>(*args): all of the schema's arguments, positionally; returns the tuple
// of its tensor outputs, or NotImplemented (see the file comment).
template <const char* kOp>
PyObject* call_op(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(kOp, "");
  const auto& params = op.schema().arguments();
  if (static_cast<size_t>(nargs) != params.size()) {
    PyErr_Format(PyExc_TypeError, "%s: takes %zu positional arguments, got %zd", kOp,
                 params.size(), nargs);
    return nullptr;
  }
  torch::jit::Stack stack;
  stack.reserve(params.size());
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    const Pushed p = push_arg(args[i], params[i], kOp, stack);
    if (p == Pushed::kError) return nullptr;
    if (p == Pushed::kSubclass) Py_RETURN_NOTIMPLEMENTED;
  }
  {
    GilRelease no_gil;
    op.callBoxed(stack);
  }
  // The outputs: a schema's tensors (a Tensor[] output as a list), or the tensors
  // of its one Tensor[] output.
  const bool one_list = stack.size() == 1 && stack[0].isTensorList();
  const std::vector<at::Tensor> flat = one_list ? stack[0].toTensorVector() : std::vector<at::Tensor>();
  const size_t n_out = one_list ? flat.size() : stack.size();
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(n_out));
  if (out == nullptr) throw python_error();
  for (size_t i = 0; i < n_out; ++i) {
    PyObject* t = one_list                     ? THPVariable_Wrap(flat[i])
                  : stack[i].isTensorList() ? wrap_tensors(stack[i].toTensorVector())
                                              : THPVariable_Wrap(stack[i].toTensor());
    if (t == nullptr) {
      Py_DECREF(out);
      throw python_error();
    }
    PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), t);
  }
  return out;
  END_HANDLE_TH_ERRORS
}

// _C.attention_fwd(*args): call_op's contract for dfgnn::attention_fwd, but the
// arguments are converted straight to the kernels' C++ types (attention_sig.h)
// and the operator is called unboxed: no IValue stack, no boxing and unboxing of
// the lists in the autograd kernel's wrapper. The forward is every eager call's
// host path.
PyObject* attention_fwd_entry(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  static const c10::OperatorHandle handle_op =
      c10::Dispatcher::singleton().findSchemaOrThrow(kAttentionFwd, "");
  static const auto op = handle_op.typed<FwdSig>();
  const auto& a = handle_op.schema().arguments();
  if (static_cast<size_t>(nargs) != a.size()) {
    PyErr_Format(PyExc_TypeError, "%s: takes %zu positional arguments, got %zd", kAttentionFwd,
                 a.size(), nargs);
    return nullptr;
  }
  const char* name = kAttentionFwd;
  std::vector<at::Tensor> inputs;
  at::Tensor layout_handle;
  OptPlan plan;
  int64_t key = 0, seed = 0;
  std::vector<double> params;
  double dropout = 0.0;
  bool need_attn = false;
  Pushed p = tensors_arg(args[0], a[0], name, inputs);
  if (p == Pushed::kOk) p = tensor_arg(args[1], a[1], name, layout_handle);
  if (p == Pushed::kOk && args[2] != Py_None) {
    c10::IValue v;
    p = object_arg(args[2], a[2], name, c10::getCustomClassType<PlanPtr>(), v);
    if (p == Pushed::kOk) plan = v.toCustomClass<CallPlan>();
  }
  if (p == Pushed::kOk) p = int_arg(args[3], a[3], name, key);
  if (p == Pushed::kOk) p = numbers_arg(args[4], a[4], name, params);
  if (p == Pushed::kOk) p = float_arg(args[5], a[5], name, dropout);
  if (p == Pushed::kOk) p = int_arg(args[6], a[6], name, seed);
  if (p == Pushed::kOk) p = bool_arg(args[7], a[7], name, need_attn);
  if (p == Pushed::kError) return nullptr;
  if (p == Pushed::kSubclass) Py_RETURN_NOTIMPLEMENTED;
  FwdResult r;
  {
    GilRelease no_gil;
    r = op.call(inputs, layout_handle, plan, key, params, dropout, seed, need_attn);
  }
  PyObject* out = PyTuple_New(5);
  if (out == nullptr) throw python_error();
  auto& [o, lse2, attn, token, saved] = r;
  const at::Tensor* tensors[] = {&o, &lse2, &attn, &token};
  for (Py_ssize_t i = 0; i < 5; ++i) {
    PyObject* t = i < 4 ? THPVariable_Wrap(*tensors[i]) : wrap_tensors(saved);
    if (t == nullptr) {
      Py_DECREF(out);
      throw python_error();
    }
    PyTuple_SET_ITEM(out, i, t);
  }
  return out;
  END_HANDLE_TH_ERRORS
}

// The plan resolver: set once, by pyg_dfgnn.ops.calls (a new registration
// replaces it, as a module reload makes one).
PyObject* resolver = nullptr;

PyObject* set_plan_resolver(PyObject* /*module*/, PyObject* fn) {
  if (!PyCallable_Check(fn)) {
    PyErr_Format(PyExc_TypeError, "set_plan_resolver: a callable, got %s", Py_TYPE(fn)->tp_name);
    return nullptr;
  }
  Py_INCREF(fn);
  Py_XSETREF(resolver, fn);
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"attention_fwd",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&attention_fwd_entry)),
     METH_FASTCALL,
     "torch.ops.dfgnn.attention_fwd without the Python op wrapper (same arguments)"},
    {"projections",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_op<kProjections>)),
     METH_FASTCALL, "torch.ops.dfgnn.projections without the Python op wrapper (same arguments)"},
    {"set_plan_resolver", &set_plan_resolver, METH_O,
     "registers fn(handle, key, inputs, dropout) -> (plan, seed), the plan and dropout seed "
     "of a forward call made without a plan (compiled code)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};

}  // namespace

PlanPtr resolve_plan(const at::Tensor& handle, int64_t key, at::TensorList inputs,
                     double dropout, int64_t* seed) {
  pybind11::gil_scoped_acquire gil;
  TORCH_CHECK(resolver != nullptr, "dfgnn::attention_fwd: a call without a plan needs "
              "pyg_dfgnn.ops imported (it builds the plan from the layout's handle)");
  PyObject* list = wrap_tensors(inputs);
  PyObject* h = THPVariable_Wrap(handle);
  if (h == nullptr) {
    Py_DECREF(list);
    throw python_error();
  }
  PyObject* res =
      PyObject_CallFunction(resolver, "OLOd", h, static_cast<long long>(key), list, dropout);
  Py_DECREF(h);
  Py_DECREF(list);
  if (res == nullptr) throw python_error();  // the resolver's exception, as it raised it
  PlanPtr plan;
  long long s = -1;
  if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2 &&
      PyLong_Check(PyTuple_GET_ITEM(res, 1))) {
    s = PyLong_AsLongLong(PyTuple_GET_ITEM(res, 1));
    try {
      plan = torch::jit::toIValue(PyTuple_GET_ITEM(res, 0), c10::getCustomClassType<PlanPtr>())
                 .toCustomClass<CallPlan>();
    } catch (const std::exception&) {
      plan.reset();
    }
  }
  Py_DECREF(res);
  if (PyErr_Occurred()) throw python_error();
  TORCH_CHECK(plan, "dfgnn::attention_fwd: the plan resolver must return (a dfgnn.Plan, an int "
              "seed)");
  *seed = static_cast<int64_t>(s);
  return plan;
}

}  // namespace dfgnn

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&dfgnn::module_def); }
