// The Python module pyg_dfgnn._C: importing it loads the library and runs the op
// registrations (bindings.cpp and the files of ops beside it), and it holds a
// direct entry to the forward ops (and the GT projections) for the eager host
// path.
//
// A small graph's training step is host-bound (docs/steps.md, "Host path"), and
// torch.ops.dfgnn.attention_fwd(*args) parses its arguments against the
// schema in Python's op wrapper (torch function checks, JIT type matching per
// argument) before the dispatcher sees them. _C.attention_fwd(*args) takes the same
// positional arguments, converts them by the schema's argument kinds and calls the
// same operator through the dispatcher, boxed: autograd (the Autograd kernel in
// attention.cpp), the profiler's record, inference mode and Python dispatch modes
// act as on the torch.ops path. Python-level dispatch (__torch_function__ of tensor
// subclasses and TorchFunctionModes) does not: a tensor argument that is not an
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
#include <vector>

#include "glue/call_plan.h"
#include "glue/call_token.h"

namespace dfgnn {
namespace {

// Releases the GIL for the operator call, as the torch.ops path does.
struct GilRelease {
  PyThreadState* state = PyEval_SaveThread();
  ~GilRelease() { PyEval_RestoreThread(state); }
};

// What push_arg did with an argument.
enum class Pushed { kOk, kSubclass, kError };

// Raises TypeError through the C API, not a C++ exception: the argument checks
// run before anything is allocated, so nothing needs unwinding, and a wrong call
// raises the same way whichever torch the extension was built against.
Pushed type_error(const char* op, const c10::Argument& arg, const char* want, PyObject* o) {
  PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be %s, got %s", op, arg.name().c_str(),
               want, Py_TYPE(o)->tp_name);
  return Pushed::kError;
}

// Converts a list or tuple `o` for a list argument of element type `elem`
// (Tensor, Tensor?, int or float) into `stack`.
Pushed push_list(PyObject* o, const c10::Argument& arg, const c10::TypePtr& elem, const char* op,
                 torch::jit::Stack& stack) {
  if (!PyList_Check(o) && !PyTuple_Check(o)) return type_error(op, arg, "a list or tuple", o);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  PyObject** items = PySequence_Fast_ITEMS(o);
  const bool optional = elem->kind() == c10::TypeKind::OptionalType;
  const c10::TypePtr inner = optional ? elem->castRaw<c10::OptionalType>()->getElementType() : elem;
  if (inner->kind() == c10::TypeKind::FloatType && !optional) {
    c10::List<double> list;
    list.reserve(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!PyFloat_Check(items[i]) && !(PyLong_Check(items[i]) && !PyBool_Check(items[i])))
        return type_error(op, arg, "a list of floats", items[i]);
      const double v = PyFloat_AsDouble(items[i]);
      if (v == -1.0 && PyErr_Occurred()) return Pushed::kError;
      list.push_back(v);
    }
    stack.emplace_back(std::move(list));
    return Pushed::kOk;
  }
  if (inner->kind() == c10::TypeKind::IntType && !optional) {
    c10::List<int64_t> list;
    list.reserve(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!PyLong_Check(items[i]) || PyBool_Check(items[i]))
        return type_error(op, arg, "a list of ints", items[i]);
      const long long v = PyLong_AsLongLong(items[i]);
      if (v == -1 && PyErr_Occurred()) return Pushed::kError;
      list.push_back(static_cast<int64_t>(v));
    }
    stack.emplace_back(std::move(list));
    return Pushed::kOk;
  }
  if (inner->kind() != c10::TypeKind::TensorType) {
    PyErr_Format(PyExc_RuntimeError,
                 "%s: argument '%s' has a type the direct entry does not convert: %s", op,
                 arg.name().c_str(), arg.type()->str().c_str());
    return Pushed::kError;
  }
  std::vector<std::optional<at::Tensor>> tensors;
  tensors.reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* t = items[i];
    if (optional && t == Py_None) {
      tensors.emplace_back();
      continue;
    }
    if (!THPVariable_Check(t)) return type_error(op, arg, "a list of Tensors", t);
    if (!THPVariable_CheckExact(t)) return Pushed::kSubclass;
    tensors.emplace_back(THPVariable_Unpack(t));
  }
  if (optional) {
    c10::List<std::optional<at::Tensor>> list;
    list.reserve(n);
    for (auto& t : tensors) list.push_back(std::move(t));
    stack.emplace_back(std::move(list));
  } else {
    c10::List<at::Tensor> list;
    list.reserve(n);
    for (auto& t : tensors) list.push_back(std::move(*t));
    stack.emplace_back(std::move(list));
  }
  return Pushed::kOk;
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
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      if (!THPVariable_Check(o)) return type_error(op, arg, "a Tensor", o);
      if (!THPVariable_CheckExact(o)) return Pushed::kSubclass;
      stack.emplace_back(THPVariable_Unpack(o));
      return Pushed::kOk;
    case c10::TypeKind::IntType: {
      if (!PyLong_Check(o) || PyBool_Check(o)) return type_error(op, arg, "an int", o);
      const long long v = PyLong_AsLongLong(o);
      if (v == -1 && PyErr_Occurred()) return Pushed::kError;
      stack.emplace_back(static_cast<int64_t>(v));
      return Pushed::kOk;
    }
    case c10::TypeKind::FloatType: {
      if (!PyFloat_Check(o) && !PyLong_Check(o)) return type_error(op, arg, "a float", o);
      const double v = PyFloat_AsDouble(o);
      if (v == -1.0 && PyErr_Occurred()) return Pushed::kError;
      stack.emplace_back(v);
      return Pushed::kOk;
    }
    case c10::TypeKind::ListType:
      return push_list(o, arg, type->castRaw<c10::ListType>()->getElementType(), op, stack);
    case c10::TypeKind::BoolType:
      if (!PyBool_Check(o)) return type_error(op, arg, "a bool", o);
      stack.emplace_back(o == Py_True);
      return Pushed::kOk;
    case c10::TypeKind::ClassType:  // a torch.classes object (the plan)
      try {
        stack.emplace_back(torch::jit::toIValue(o, type));
      } catch (const std::exception&) {
        return type_error(op, arg, type->str().c_str(), o);
      }
      return Pushed::kOk;
    default:
      PyErr_Format(PyExc_RuntimeError,
                   "%s: argument '%s' has a type the direct entry does not convert: %s", op,
                   arg.name().c_str(), type->str().c_str());
      return Pushed::kError;
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

constexpr char kAttentionFwd[] = "dfgnn::attention_fwd";
constexpr char kProjections[] = "dfgnn::projections";

PyMethodDef methods[] = {
    {"attention_fwd",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_op<kAttentionFwd>)),
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
