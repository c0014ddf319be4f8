// The Python module pyg_dfgnn._C: importing it loads the library and runs the op
// registrations (bindings.cpp, autograd.cpp), and it holds a direct entry to the
// forward ops for the eager host path.
//
// A small graph's training step is host-bound (docs/design.md, "Host path"), and
// torch.ops.dfgnn.gt_fwd(*args) parses its 22 arguments against the
// schema in Python's op wrapper (torch function checks, JIT type matching per
// argument) before the dispatcher sees them. _C.gt_fwd(*args) takes the same
// positional arguments, converts them by the schema's argument kinds and calls the
// same operator through the dispatcher, boxed: autograd (the Autograd kernel in
// autograd.cpp), the profiler's record, inference mode and Python dispatch modes
// act as on the torch.ops path. Python-level dispatch (__torch_function__ of tensor
// subclasses and TorchFunctionModes) does not: a tensor argument that is not an
// exact torch.Tensor returns NotImplemented, and pyg_dfgnn.ops takes the torch.ops
// path for it, for torch function modes and under torch.compile (ops/__init__.py,
// _call_op).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>

namespace dfgnn {
namespace {

// Releases the GIL for the operator call, as the torch.ops path does.
struct GilRelease {
  PyThreadState* state = PyEval_SaveThread();
  ~GilRelease() { PyEval_RestoreThread(state); }
};

// Converts args[i] for the schema's argument `arg`; false: a tensor subclass (the
// caller returns NotImplemented).
bool push_arg(PyObject* o, const c10::Argument& arg, const char* op, torch::jit::Stack& stack) {
  c10::TypePtr type = arg.type();
  if (type->kind() == c10::TypeKind::OptionalType) {
    if (o == Py_None) {
      stack.emplace_back();
      return true;
    }
    type = type->castRaw<c10::OptionalType>()->getElementType();
  }
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      TORCH_CHECK_TYPE(THPVariable_Check(o), op, ": argument '", arg.name(),
                       "' must be a Tensor, got ", Py_TYPE(o)->tp_name);
      if (!THPVariable_CheckExact(o)) return false;
      stack.emplace_back(THPVariable_Unpack(o));
      return true;
    case c10::TypeKind::IntType: {
      TORCH_CHECK_TYPE(PyLong_Check(o) && !PyBool_Check(o), op, ": argument '", arg.name(),
                       "' must be an int, got ", Py_TYPE(o)->tp_name);
      const long long v = PyLong_AsLongLong(o);
      if (v == -1 && PyErr_Occurred()) throw python_error();
      stack.emplace_back(static_cast<int64_t>(v));
      return true;
    }
    case c10::TypeKind::FloatType: {
      TORCH_CHECK_TYPE(PyFloat_Check(o) || PyLong_Check(o), op, ": argument '", arg.name(),
                       "' must be a float, got ", Py_TYPE(o)->tp_name);
      const double v = PyFloat_AsDouble(o);
      if (v == -1.0 && PyErr_Occurred()) throw python_error();
      stack.emplace_back(v);
      return true;
    }
    case c10::TypeKind::BoolType:
      TORCH_CHECK_TYPE(PyBool_Check(o), op, ": argument '", arg.name(),
                       "' must be a bool, got ", Py_TYPE(o)->tp_name);
      stack.emplace_back(o == Py_True);
      return true;
    default:
      TORCH_INTERNAL_ASSERT(false, op, ": argument '", arg.name(), "' has a type the direct "
                            "entry does not convert: ", type->str());
  }
}

// _C.<op>(*args): all of the schema's arguments, positionally; returns the tuple
// of its tensor outputs, or NotImplemented (see the file comment).
template <const char* kOp>
PyObject* call_op(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(kOp, "");
  const auto& params = op.schema().arguments();
  TORCH_CHECK_TYPE(static_cast<size_t>(nargs) == params.size(), kOp, ": takes ",
                   params.size(), " positional arguments, got ", nargs);
  torch::jit::Stack stack;
  stack.reserve(params.size());
  for (Py_ssize_t i = 0; i < nargs; ++i)
    if (!push_arg(args[i], params[i], kOp, stack)) Py_RETURN_NOTIMPLEMENTED;
  {
    GilRelease no_gil;
    op.callBoxed(stack);
  }
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(stack.size()));
  if (out == nullptr) throw python_error();
  for (size_t i = 0; i < stack.size(); ++i) {
    PyObject* t = THPVariable_Wrap(stack[i].toTensor());
    if (t == nullptr) {
      Py_DECREF(out);
      throw python_error();
    }
    PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), t);
  }
  return out;
  END_HANDLE_TH_ERRORS
}

constexpr char kGtFwd[] = "dfgnn::gt_fwd";
constexpr char kGatFwd[] = "dfgnn::gat_fwd";
constexpr char kAgnnFwd[] = "dfgnn::agnn_fwd";

PyMethodDef methods[] = {
    {"gt_fwd", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_op<kGtFwd>)),
     METH_FASTCALL, "torch.ops.dfgnn.gt_fwd without the Python op wrapper (same arguments)"},
    {"gat_fwd", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_op<kGatFwd>)),
     METH_FASTCALL, "torch.ops.dfgnn.gat_fwd without the Python op wrapper (same arguments)"},
    {"agnn_fwd", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_op<kAgnnFwd>)),
     METH_FASTCALL, "torch.ops.dfgnn.agnn_fwd without the Python op wrapper (same arguments)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};

}  // namespace
}  // namespace dfgnn

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&dfgnn::module_def); }
