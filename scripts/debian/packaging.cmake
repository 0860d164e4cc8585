# SPDX-License-Identifier: Apache-2.0
# Debian packages (scripts/package runs `cpack -G DEB` in a build configured for /usr):
#   ringloader               ringloaderd, ringloaderctl, the systemd unit, sysusers.d and tmpfiles.d
#                            files, /etc/ringloader/ringloaderd.toml (a conffile), man pages
#   python3-ringloader       the Python package and its extension, in /usr/lib/python3/dist-packages
#   libringloader-client0.1  libringloader-client.so.0.1, the SDK's shared library (client API
#                            only), named for its SONAME as Debian's policy has it (8.1): one
#                            package per minor version before 1.0 (RINGLOADER_CLIENT_SOVERSION)
#   libringloader-client-dev <ringloader/client.h>, the CMake package, ringloader-client.pc
# One component each (runtime, python, client, sdk): `cmake --install` installs the same parts. The version is the project's
# (CMakeLists.txt); dependencies on Debian's libraries come from dpkg-shlibdeps.
set(RINGLOADER_DEBIAN_DIR ${CMAKE_CURRENT_LIST_DIR})
set(DEB_STAGING ${CMAKE_BINARY_DIR}/debian)
set(RINGLOADER_CLIENT_PACKAGE libringloader-client${RINGLOADER_CLIENT_SOVERSION})
set(RINGLOADER_DEB_PACKAGES ringloader python3-ringloader ${RINGLOADER_CLIENT_PACKAGE}
                            libringloader-client-dev)
set(RINGLOADER_DEB_COMPONENTS runtime python client sdk)

find_program(GZIP_PROGRAM gzip REQUIRED)
# Descriptions: the synopsis, then paragraphs (CPack indents them; an empty line is " .").
# Every package carries the copyright file and the changelog (native: changelog.gz).
configure_file(${RINGLOADER_DEBIAN_DIR}/changelog.in ${DEB_STAGING}/changelog @ONLY)
add_custom_command(OUTPUT ${DEB_STAGING}/changelog.gz
  COMMAND ${GZIP_PROGRAM} -9nc ${DEB_STAGING}/changelog > ${DEB_STAGING}/changelog.gz
  DEPENDS ${DEB_STAGING}/changelog VERBATIM)
add_custom_target(ringloader_deb_changelog ALL DEPENDS ${DEB_STAGING}/changelog.gz)
foreach(package component IN ZIP_LISTS RINGLOADER_DEB_PACKAGES RINGLOADER_DEB_COMPONENTS)
  install(FILES ${RINGLOADER_DEBIAN_DIR}/copyright ${DEB_STAGING}/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package} COMPONENT ${component})
endforeach()

# Man pages, from the programs' own --help (help2man).
find_program(HELP2MAN help2man REQUIRED)
block()
  function(ringloader_man_page program section name)
    set(page ${DEB_STAGING}/man/${program}.${section})
    add_custom_command(OUTPUT ${page}.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${DEB_STAGING}/man
      COMMAND ${HELP2MAN} --no-info --no-discard-stderr --section=${section} --name=${name}
              --source=ringloader --output=${page} $<TARGET_FILE:${program}>
      COMMAND ${GZIP_PROGRAM} -9nf ${page}
      DEPENDS ${program} VERBATIM)
    install(FILES ${page}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section} COMPONENT runtime)
    set(pages ${pages} ${page}.gz PARENT_SCOPE)
  endfunction()
  ringloader_man_page(ringloaderd 8
                      "data-loading daemon: decodes and batches images into shared memory")
  ringloader_man_page(ringloaderctl 1 "control, probe and exercise a ringloaderd")
  add_custom_target(ringloader_man_pages ALL DEPENDS ${pages})
endblock()

# Maintainer scripts and control files, named as dpkg wants them.
# <source> is the files' prefix in scripts/debian/ (the package name but for the library's, whose
# name changes with its SONAME).
function(ringloader_deb_control package source component)
  set(files)
  foreach(name IN LISTS ARGN)
    configure_file(${RINGLOADER_DEBIAN_DIR}/${source}.${name} ${DEB_STAGING}/${package}/${name}
                   COPYONLY)
    list(APPEND files ${DEB_STAGING}/${package}/${name})
  endforeach()
  string(TOUPPER ${component} upper)
  set(CPACK_DEBIAN_${upper}_PACKAGE_CONTROL_EXTRA "${files}" PARENT_SCOPE)
endfunction()
ringloader_deb_control(ringloader ringloader runtime conffiles postinst prerm postrm)
ringloader_deb_control(python3-ringloader python3-ringloader python postinst prerm)
# ldconfig runs from the trigger (CPack also adds postinst/postrm calling it: see
# lintian-suppressed).
# shlibs: what a trainer built against this version needs ("<library> <SONAME version>
# <dependency>"). The SONAME changes with every minor version before 1.0, so the package named for
# it is all the bound there is: a trainer built against 0.1.x needs libringloader-client0.1, which
# 0.2's packages neither replace nor remove.
file(WRITE ${DEB_STAGING}/${RINGLOADER_CLIENT_PACKAGE}/shlibs
     "libringloader-client ${RINGLOADER_CLIENT_SOVERSION} ${RINGLOADER_CLIENT_PACKAGE} (>= ${RINGLOADER_VERSION})\n")
ringloader_deb_control(${RINGLOADER_CLIENT_PACKAGE} libringloader-client client triggers)
set(CPACK_DEBIAN_CLIENT_PACKAGE_CONTROL_EXTRA
    "${CPACK_DEBIAN_CLIENT_PACKAGE_CONTROL_EXTRA};${DEB_STAGING}/${RINGLOADER_CLIENT_PACKAGE}/shlibs")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ringloader)
set(CPACK_PACKAGE_VERSION ${RINGLOADER_VERSION})
set(CPACK_PACKAGE_CONTACT "ringloader maintainers <maintainers@users.noreply.a-seed-f9792547.example>")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL ${RINGLOADER_DEB_COMPONENTS})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_VERSION ${RINGLOADER_VERSION})
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
# Absolute destinations (/etc, /lib/systemd/system) go into the package, not onto this host.
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ringloader)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION misc)
# systemd-sysusers and systemd-tmpfiles (postinst; deb-systemd-helper is essential), /bin/kill
# (the unit's ExecReload).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS
    "systemd | systemd-standalone-sysusers, systemd | systemd-standalone-tmpfiles, procps")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "python3-ringloader, libringloader-client-dev")
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
"data-loading daemon for machine-learning training hosts
ringloaderd reads training samples (ImageFolder, manifests, WebDataset,
TFRecord, .npy arrays), decodes and augments images with libjpeg-turbo and
batches them into a shared-memory ring that trainers read in place. A
decoder crash or an out-of-memory kill takes down only the daemon: systemd
restarts it and trainers resume at their exact next batch.

This package holds the daemon (a systemd service running as the ringloader
user), ringloaderctl (health probes, stats, doctor, validate) and
/etc/ringloader/ringloaderd.toml.")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-ringloader)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "${RINGLOADER_PYTHON_DEB_DEPENDS}, python3-numpy")
set(CPACK_DEBIAN_PYTHON_PACKAGE_RECOMMENDS ringloader)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SUGGESTS "python3-torch")
set(CPACK_DEBIAN_PYTHON_DESCRIPTION
"Python client of the ringloader data-loading daemon
A Loader that reads batches of a ringloaderd's shared-memory ring in place,
with the names PyTorch's DataLoader uses (iter, set_epoch, len, state_dict,
load_state_dict), and ringloader.torch for tensors. A checkpoint's state
resumes at the exact next batch, also in a job of another world size.")

set(CPACK_DEBIAN_CLIENT_PACKAGE_NAME ${RINGLOADER_CLIENT_PACKAGE})
set(CPACK_DEBIAN_CLIENT_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_CLIENT_DESCRIPTION
"C++ client library of the ringloader data-loading daemon
libringloader-client reads batches of a ringloaderd's shared-memory ring in
place from a C++ trainer. It exports only its C++ API: the code compiled into
it (its protobuf messages, inline code of the gRPC, protobuf and abseil
headers) is hidden and never binds to a trainer's own definitions.")

set(CPACK_DEBIAN_SDK_PACKAGE_NAME libringloader-client-dev)
set(CPACK_DEBIAN_SDK_PACKAGE_SECTION libdevel)
# The exact library the header describes (a trainer built now links its SONAME).
set(CPACK_DEBIAN_SDK_PACKAGE_DEPENDS "${RINGLOADER_CLIENT_PACKAGE} (= ${RINGLOADER_VERSION})")
set(CPACK_DEBIAN_SDK_DESCRIPTION
"C++ client library of the ringloader data-loading daemon (development files)
The header <ringloader/client.h> (C++20, standard library only), the CMake
package (find_package(ringloader) gives ringloader::client) and the pkg-
config file ringloader-client.pc, to build a trainer against libringloader-
client.")

include(CPack)
