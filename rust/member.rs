//! Member descriptors as `__slots__` makes them: what the snapshot reads (`bound/`) and the
//! write-back sets (`writeback/slots.rs`) in the object itself, where the interpreter keeps a
//! slot's value, instead of calling the descriptor.

use pyo3::ffi;

/// `descr` as a member descriptor, if it is one.
///
/// # Safety
/// `descr` must point to a live object, which must outlive the reference returned.
pub unsafe fn member_descr<'a>(descr: *mut ffi::PyObject) -> Option<&'a ffi::PyMemberDescrObject> {
    unsafe {
        (ffi::Py_TYPE(descr) == std::ptr::addr_of_mut!(ffi::PyMemberDescr_Type))
            .then(|| &*descr.cast::<ffi::PyMemberDescrObject>())
    }
}

/// Where an instance stores the value of `descr`, with the class that defines it, when `descr`
/// is a plain object member (`Py_T_OBJECT_EX` at an absolute offset, no audit hook on reads;
/// not read-only where `writable` is asked): there `PyMember_GetOne` and `PyMember_SetOne`
/// read and swap one pointer, once the object is checked to be an instance of that class.
///
/// # Safety
/// `descr` must point to a live object.
pub unsafe fn object_member(
    descr: *mut ffi::PyObject,
    writable: bool,
) -> Option<(isize, *mut ffi::PyTypeObject)> {
    let descr = unsafe { member_descr(descr)? };
    let member = unsafe { descr.d_member.as_ref()? };
    let mut refused = ffi::Py_AUDIT_READ | ffi::Py_RELATIVE_OFFSET;
    if writable {
        refused |= ffi::Py_READONLY;
    }
    (member.type_code == ffi::Py_T_OBJECT_EX && member.flags & refused == 0)
        .then_some((member.offset, descr.d_common.d_type))
}
